// Command reflow-crds joins the hard-wrapped lines of the CRDs' descriptions into
// paragraphs, so that `kubectl explain` (which wraps text itself) never breaks a
// sentence in the middle of its line. controller-gen copies Go doc comments line by
// line; Go comments are wrapped at ~100 columns, so without this every field's
// explanation reads as ragged fragments.
//
// It rewrites, in place, every `description: |-` block scalar of the YAML files named
// on the command line: lines of one paragraph are joined with a space; blank lines
// (paragraph breaks), list items ("- ", "* ", "1. ") and lines indented deeper than
// the block (examples) keep their own lines. Nothing else in the file changes.
//
// Usage: go run ./hack/reflow-crds config/crd/bases/*.yaml
package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

var (
	blockStart = regexp.MustCompile(`^(\s*(?:- )?)description: \|-?$`)
	listItem   = regexp.MustCompile(`^(?:[-*+] |[0-9]+[.)] )`)
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: reflow-crds FILE.yaml...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		in, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "reflow-crds:", err)
			os.Exit(1)
		}
		out := Reflow(string(in))
		if out == string(in) {
			continue
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "reflow-crds:", err)
			os.Exit(1)
		}
	}
}

// Reflow rewrites the description block scalars of one YAML document.
func Reflow(doc string) string {
	lines := strings.Split(doc, "\n")
	var out []string
	for i := 0; i < len(lines); {
		line := lines[i]
		out = append(out, line)
		i++
		m := blockStart.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		// The block is every following line indented deeper than the key (or blank);
		// a key that opens a list item ("- description:") is indented past the "- ".
		keyIndent := len(m[1])
		var block []string
		for i < len(lines) && (strings.TrimSpace(lines[i]) == "" || indentOf(lines[i]) > keyIndent) {
			block = append(block, lines[i])
			i++
		}
		// Trailing blank lines belong to what follows, not to the scalar.
		tail := len(block)
		for tail > 0 && strings.TrimSpace(block[tail-1]) == "" {
			tail--
		}
		out = append(out, reflowBlock(block[:tail])...)
		out = append(out, block[tail:]...)
	}
	return strings.Join(out, "\n")
}

// reflowBlock joins the lines of each paragraph of one block scalar's content.
func reflowBlock(block []string) []string {
	if len(block) == 0 {
		return nil
	}
	base := -1
	for _, l := range block {
		if strings.TrimSpace(l) != "" && (base < 0 || indentOf(l) < base) {
			base = indentOf(l)
		}
	}
	var out []string
	joinable := false // whether the last output line is prose that may take the next
	for _, l := range block {
		text := strings.TrimSpace(l)
		switch {
		case text == "":
			out = append(out, l)
			joinable = false
		case indentOf(l) > base || listItem.MatchString(text):
			out = append(out, l)
			joinable = indentOf(l) == base // a list item's continuation lines join it
		case joinable:
			out[len(out)-1] += " " + text
		default:
			out = append(out, l)
			joinable = true
		}
	}
	return out
}

func indentOf(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
