package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// commandFlags returns the flags a command defines, read from its -h output
// (what a user sees), so that flags registered by shared helpers count too.
func commandFlags(t *testing.T, name string) map[string]bool {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "usage")
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = out
	runErr := commands[name].run([]string{"-h"})
	os.Stderr = stderr
	if !errors.Is(runErr, flag.ErrHelp) {
		t.Fatalf("ddflash %s -h: %v, want flag.ErrHelp", name, runErr)
	}
	usage, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(usage), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("ddflash %s -h listed no flags:\n%s", name, usage)
	}
	return flags
}

// TestReadmeFlagsExist checks that every --flag the README names is a flag of
// some command, and that every flag on a "ddflash COMMAND ..." line is one of
// that command's.
func TestReadmeFlagsExist(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(readme), "\\\n", " ") // shell line continuations
	flagRE := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

	perCommand, anyCommand := map[string]map[string]bool{}, map[string]bool{}
	for name := range commands {
		perCommand[name] = commandFlags(t, name)
		for f := range perCommand[name] {
			anyCommand[f] = true
		}
	}
	for _, m := range flagRE.FindAllStringSubmatch(text, -1) {
		if !anyCommand[m[1]] {
			t.Errorf("README names --%s, which no command defines", m[1])
		}
	}
	for _, m := range regexp.MustCompile("ddflash ([a-z]+)([^`\n]*)").FindAllStringSubmatch(text, -1) {
		flags, ok := perCommand[m[1]]
		if !ok {
			continue // prose such as "ddflash is ..."
		}
		for _, f := range flagRE.FindAllStringSubmatch(m[2], -1) {
			if !flags[f[1]] {
				t.Errorf("README: ddflash %s has no --%s (in %q)", m[1], f[1], strings.TrimSpace(m[0]))
			}
		}
	}
}

// githubAnchor is the id GitHub gives a heading: lower case, punctuation
// and symbols dropped, spaces turned into hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownAnchors returns the anchors of a Markdown file's headings (outside
// code blocks), repeated headings numbered as GitHub numbers them.
func markdownAnchors(text string) map[string]bool {
	anchors, seen, fenced := map[string]bool{}, map[string]int{}, false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fenced || !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		a := githubAnchor(heading)
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// TestDocsLinksResolve checks every relative link of README.md and docs/*.md:
// the file exists and, for a #fragment into Markdown, the heading does.
func TestDocsLinksResolve(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fenceRE := regexp.MustCompile("(?s)```.*?```")
	urlRE := regexp.MustCompile(`^[a-z]+:`)
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(string(text), ""), -1) {
			target := m[1]
			if urlRE.MatchString(target) {
				continue // a URL
			}
			path, fragment, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
			}
			linked, err := os.ReadFile(resolved)
			if err != nil {
				t.Errorf("%s: link %s: %v", filepath.Base(file), target, err)
				continue
			}
			if fragment != "" && strings.HasSuffix(resolved, ".md") && !markdownAnchors(string(linked))[fragment] {
				t.Errorf("%s: link %s: no heading with that anchor", filepath.Base(file), target)
			}
		}
	}
}
