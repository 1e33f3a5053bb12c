//go:build cgo

package cuda

import (
	"embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ptxFS holds the kernels compiled by gen.sh, one folder per target arch.
//
//go:embed ptx
var ptxFS embed.FS

// param is a kernel parameter as the PTX declares it.
type param struct {
	size  int
	float bool // .f32 (a float32 argument), not an integer of that size
}

// kernelParams maps every kernel in the embedded PTX to its parameters, so
// that launch can reject arguments that do not match the kernel's
// signature: a mismatch would otherwise read garbage on the device.
var kernelParams = parsePTXParams("ptx/sm_80")

// KernelNames lists every kernel in the embedded PTX (for the CPU
// emulation, kernels/cuda/emulator).
func KernelNames() []string {
	names := make([]string, 0, len(kernelParams))
	for name := range kernelParams {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

var (
	entryRE = regexp.MustCompile(`(?s)\.entry\s+(\w+)\(\s*(.*?)\)`)
	paramRE = regexp.MustCompile(`\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\s+\w+(?:\[(\d+)\])?`)
)

func parsePTXParams(dir string) map[string][]param {
	entries, err := ptxFS.ReadDir(dir)
	if err != nil {
		panic(err)
	}
	out := map[string][]param{}
	for _, e := range entries {
		src, err := ptxFS.ReadFile(dir + "/" + e.Name())
		if err != nil {
			panic(err)
		}
		for _, m := range entryRE.FindAllStringSubmatch(string(src), -1) {
			var ps []param
			for _, decl := range strings.Split(m[2], ",") {
				if strings.TrimSpace(decl) == "" {
					continue
				}
				p := paramRE.FindStringSubmatch(decl)
				if p == nil {
					panic(fmt.Sprintf("cuda: cannot read parameter %q of kernel %s", decl, m[1]))
				}
				bits, _ := strconv.Atoi(p[2])
				size := bits / 8
				if p[3] != "" { // .b8 name[n]: a struct by value
					size, _ = strconv.Atoi(p[3])
				}
				ps = append(ps, param{size: size, float: p[1] == "f"})
			}
			out[m[1]] = ps
		}
	}
	return out
}

// checkArgs panics unless args match kernel name's parameters in number,
// size and (for 4-byte values) float versus integer.
func checkArgs(name string, args []any) {
	ps, ok := kernelParams[name]
	if !ok {
		panic(fmt.Sprintf("cuda: no kernel %q in the embedded PTX (run make cuda)", name))
	}
	if len(args) != len(ps) {
		panic(fmt.Sprintf("cuda: kernel %s takes %d arguments, got %d", name, len(ps), len(args)))
	}
	for i, a := range args {
		size := len(argBytes(a))
		_, isFloat := a.(float32)
		if size != ps[i].size || (size == 4 && isFloat != ps[i].float) {
			panic(fmt.Sprintf("cuda: kernel %s argument %d: a %T (%d bytes) for a %d-byte %s parameter",
				name, i, a, size, ps[i].size, map[bool]string{true: "float", false: "integer"}[ps[i].float]))
		}
	}
}
