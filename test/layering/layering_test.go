// Package layering_test holds the project's package rules, written once: which of our
// packages may import which, and how large a package may grow. docs/design.md §2
// describes the layout they keep; a change that breaks one fails here, not in review.
package layering_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/settlement-operator/settlement-operator"

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

// repoRoot is the module's root, found from this file's place in it.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's own file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ourPackages lists every package of the module with its imports and dependencies.
func ourPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = repoRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found only %d packages: the rules below would check nothing", len(pkgs))
	}
	return pkgs
}

// rel is an import path relative to the module ("" for a path outside it).
func rel(path string) string {
	if path == module {
		return "."
	}
	if r, ok := strings.CutPrefix(path, module+"/"); ok {
		return r
	}
	return ""
}

// under reports whether a module-relative path is dir or inside it.
func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// reconcilerOf is the reconciler package a module-relative path belongs to
// (controllers/<kind>), or "".
func reconcilerOf(path string) string {
	parts := strings.Split(path, "/")
	if len(parts) >= 2 && parts[0] == "controllers" {
		return parts[0] + "/" + parts[1]
	}
	return ""
}

// importRule is one rule over a package's imports: broken returns why an import (or a
// dependency, for rules over dependencies) of the package is not allowed, or "".
type importRule struct {
	name string
	// deps: the rule reads every package the package depends on, not only what it imports.
	deps   bool
	broken func(from, to string) string
}

var importRules = []importRule{
	{
		// Each reconciler is read and changed on its own: what two of them share moves
		// below them (api/v1alpha1, internal/...), so no reconciler's change can alter
		// another's behaviour unseen, and no import cycle can form between them.
		name: "no reconciler package imports another",
		broken: func(from, to string) string {
			f, t := reconcilerOf(rel(from)), reconcilerOf(rel(to))
			if f != "" && t != "" && f != t {
				return fmt.Sprintf("%s imports %s", from, to)
			}
			return ""
		},
	},
	{
		// internal/ holds the libraries the reconcilers and mains are made of; one that
		// reached up into a reconciler or a main would make the layers a circle.
		name: "nothing under internal/ imports controllers/ or cmd/",
		broken: func(from, to string) string {
			if under(rel(from), "internal") && (under(rel(to), "controllers") || under(rel(to), "cmd")) {
				return fmt.Sprintf("%s imports %s", from, to)
			}
			return ""
		},
	},
	{
		// The money decision is pure: everything it decides on is passed in, so its
		// table tests cover it whole and a payments engineer audits it without reading
		// Kubernetes plumbing. Neither a Kubernetes client nor any provider adapter may
		// be among its dependencies, direct or indirect.
		name: "internal/settlement depends on no client-go, controller-runtime or adapter",
		deps: true,
		broken: func(from, to string) string {
			if rel(from) != "internal/settlement" {
				return ""
			}
			switch {
			case under(to, "k8s.io/client-go"), under(to, "sigs.k8s.io/controller-runtime"):
				return fmt.Sprintf("%s depends on %s", from, to)
			case under(rel(to), "internal/billing") && rel(to) != "internal/billing":
				// internal/billing is the adapter contract (requests, records, error
				// classes); its sub-packages are the adapters.
				return fmt.Sprintf("%s depends on the adapter %s", from, to)
			}
			return ""
		},
	},
	{
		// The API types are what users and other tools build against: they carry no
		// code of ours, so importing them never brings the operator along.
		name: "api/ imports nothing of ours",
		broken: func(from, to string) string {
			if under(rel(from), "api") && rel(to) != "" && !under(rel(to), "api") {
				return fmt.Sprintf("%s imports %s", from, to)
			}
			return ""
		},
	},
}

// TestImports checks every import rule against every package of the module. Test
// files are not counted: a test may start the whole operator (test/integration does),
// or a reconciler to make its fixtures ready (the receiver's suite does).
func TestImports(t *testing.T) {
	pkgs := ourPackages(t)
	for _, rule := range importRules {
		t.Run(rule.name, func(t *testing.T) {
			for _, p := range pkgs {
				list := p.Imports
				if rule.deps {
					list = p.Deps
				}
				var broken []string
				for _, to := range list {
					if why := rule.broken(p.ImportPath, to); why != "" {
						broken = append(broken, why)
					}
				}
				// A forbidden import brings its own dependencies along: the first few
				// name it, the count says how far it reaches.
				if n := len(broken); n > 3 {
					broken = append(broken[:3], fmt.Sprintf("and %d more", n-3))
				}
				if len(broken) > 0 {
					t.Errorf("%s:\n\t%s", rule.name, strings.Join(broken, "\n\t"))
				}
			}
		})
	}
}

// Limits of one package, not counting tests and generated files: past them a package
// holds more than one reader can keep in mind, and should be split along what it does.
const (
	maxPackageLines = 2500
	maxPackageFiles = 12
	// maxAPILines is the API package's own line limit: it is one group version (its
	// kinds cannot be split into packages without splitting the API), and most of its
	// lines are the field docs `kubectl explain` shows and the markers that become the
	// CRDs' validation. Still bounded, so the schema's growth is a decision.
	maxAPILines = 3500
)

// TestPackageSize checks every package outside test/ and hack/ (fakes, suites and
// scripts) against the limits.
func TestPackageSize(t *testing.T) {
	for _, p := range ourPackages(t) {
		r := rel(p.ImportPath)
		if under(r, "test") || under(r, "hack") {
			continue
		}
		files, lines := 0, 0
		for _, f := range p.GoFiles {
			if strings.HasPrefix(f, "zz_generated") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			files++
			lines += bytes.Count(b, []byte("\n"))
		}
		maxLines := maxPackageLines
		if r == "api/v1alpha1" {
			maxLines = maxAPILines
		}
		if lines > maxLines || files > maxPackageFiles {
			t.Errorf("%s has %d lines in %d files (at most %d lines and %d files, tests and generated files not counted): split it along what it does",
				r, lines, files, maxLines, maxPackageFiles)
		}
	}
}
