package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestSpecFlags(t *testing.T) {
	for _, c := range []struct {
		args   string
		budget int
		policy string // the policy's name, "" for none
		err    string
	}{
		{"--spec ddtree", 15, "", ""},
		{"--spec ddtree --budget 8", 8, "", ""},
		{"--spec ddtree --budget auto", 32, "ddtree-auto", ""},
		{"--spec ddtree --budget auto --max-budget 16", 16, "ddtree-auto", ""},
		{"--spec adaptive", 32, "adaptive", ""},
		{"--spec adaptive --max-budget 64", 64, "adaptive", ""},
		{"--spec linear --budget auto", 0, "", "--budget auto applies to --spec ddtree"},
		{"--spec adaptive --max-budget 0", 0, "", "--max-budget 0"},
		{"--spec ddtree --budget 0", 0, "", "--budget 0"},
		{"--spec tree", 0, "", "adaptive, mtp or mtp-ddtree"},
		{"--spec mtp --mtp-steps 4", 15, "", ""},
		{"--spec mtp-ddtree --budget 6", 6, "", ""},
		{"--spec mtp --mtp-steps 9", 0, "", "--mtp-steps 9: want 1..8"},
		{"--spec mtp --mtp-steps 0", 0, "", "--mtp-steps 0"},
		{"--spec adaptive --with-mtp --mtp-steps 4", 32, "adaptive", ""},
		{"--spec ddtree --with-mtp", 0, "", "--with-mtp chooses between drafters under --spec adaptive, not ddtree"},
		{"--spec adaptive --with-mtp --mtp-steps 9", 0, "", "--mtp-steps 9: want 1..8"},
		{"--budget many", 0, "", "want a node count or auto"},
	} {
		var m modelFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		m.register(fs)
		err := fs.Parse(append(strings.Fields(c.args), "--draft", "d"))
		if err == nil {
			spec, serr := m.specOptions()
			err = serr
			if err == nil {
				name := ""
				if spec.Policy != nil {
					name = spec.Policy.Name()
				}
				if spec.Budget != c.budget || name != c.policy {
					t.Errorf("%s: budget %d policy %q, want %d %q", c.args, spec.Budget, name, c.budget, c.policy)
				}
			}
		}
		if (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: error %v, want %q", c.args, err, c.err)
		}
	}
}

func TestDraftDepthFlag(t *testing.T) {
	for _, c := range []struct {
		args  string
		depth int
		err   string
	}{
		{"--spec ddtree --budget 4", 0, ""},
		{"--spec ddtree --budget 4 --draft-depth 4", 4, ""},
		{"--spec linear --draft-depth 7", 7, ""},
		{"--spec ddtree --draft-depth -1", 0, "--draft-depth -1"},
	} {
		var m modelFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		m.register(fs)
		if err := fs.Parse(append(strings.Fields(c.args), "--draft", "d")); err != nil {
			t.Fatal(err)
		}
		spec, err := m.specOptions()
		if (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: error %v, want %q", c.args, err, c.err)
		} else if err == nil && spec.DraftDepth != c.depth {
			t.Errorf("%s: draft depth %d, want %d", c.args, spec.DraftDepth, c.depth)
		}
	}
}
