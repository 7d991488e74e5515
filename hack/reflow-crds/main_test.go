package main

import "testing"

func TestReflow(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"joins a wrapped paragraph",
			"  description: |-\n    a sentence that\n    goes on.\n  type: string\n",
			"  description: |-\n    a sentence that goes on.\n  type: string\n"},
		{"keeps paragraphs apart",
			"      description: |-\n        one\n        two.\n\n        three\n        four.\n      type: object\n",
			"      description: |-\n        one two.\n\n        three four.\n      type: object\n"},
		{"keeps list items, joins their continuation",
			"  description: |-\n    choices:\n    - A, the first\n      and best\n    - B\n  type: string\n",
			"  description: |-\n    choices:\n    - A, the first\n      and best\n    - B\n  type: string\n"},
		{"leaves one-line and plain descriptions alone",
			"  description: short\n  x:\n    description: |-\n      one line\n",
			"  description: short\n  x:\n    description: |-\n      one line\n"},
		{"description as a list item's key",
			"- description: |-\n    a\n    b\n  name: x\n",
			"- description: |-\n    a b\n  name: x\n"},
		{"a block at the end of the file",
			"description: |-\n  a\n  b",
			"description: |-\n  a b"},
	} {
		if got := Reflow(c.in); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}
