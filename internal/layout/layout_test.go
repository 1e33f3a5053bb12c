package layout

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "ddflash"

// purePackages are pure functions over small structs (draft trees, the
// adaptive policy, the prefix tree) and the row kernels that ddtree shares
// with the samplers and the CPU backend: they must work without an engine
// or a backend, so that they can be tested and reused on their own.
var purePackages = []string{"ddtree", "adaptive", "prefixtree", "kernels/rowmath"}

// forbidden are the packages (with everything under them) that a pure
// package may not depend on, directly or through another package: the
// engine and the backends.
var forbidden = []string{"engine", "kernels/cpu", "kernels/cuda", "kernels/device"}

// TestPurePackagesImportNoEngineOrBackend follows every import of the pure
// packages' non-test files within the module, whatever their build tags
// (a cuda-only file counts too), and fails on any path to a forbidden
// package, naming the chain of imports.
func TestPurePackagesImportNoEngineOrBackend(t *testing.T) {
	root := moduleRoot(t)
	for _, pkg := range purePackages {
		// via[p] is the package that imports p on the first path found from pkg.
		via := map[string]string{pkg: ""}
		queue := []string{pkg}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			if isForbidden(p) {
				chain := []string{p}
				for q := via[p]; q != ""; q = via[q] {
					chain = append(chain, q)
				}
				slices.Reverse(chain)
				t.Errorf("%s depends on %s: %s", pkg, p, strings.Join(chain, " → "))
				continue
			}
			for _, imp := range moduleImports(t, root, p) {
				if _, seen := via[imp]; !seen {
					via[imp] = p
					queue = append(queue, imp)
				}
			}
		}
	}
}

func isForbidden(pkg string) bool {
	for _, f := range forbidden {
		if pkg == f || strings.HasPrefix(pkg, f+"/") {
			return true
		}
	}
	return false
}

// moduleImports returns the module's packages (as paths from its root)
// that the non-test Go files of dir import.
func moduleImports(t *testing.T, root, dir string) []string {
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("package %s: no Go files (%v)", dir, err)
	}
	var out []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range f.Imports {
			path, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if rest, ok := strings.CutPrefix(path, module+"/"); ok && !slices.Contains(out, rest) {
				out = append(out, rest)
			}
		}
	}
	return out
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
