// Package gpu names the GPUs the planner knows and reads the local one's
// memory through NVML when a driver is present.
package gpu

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Device is a GPU's memory as the planner sees it.
type Device struct {
	Name  string
	Total int64 // bytes
	Free  int64 // bytes free now; 0 when unknown (a preset or a size given by hand)
}

// presets are memory totals as nvidia-smi and NVML report them, in MiB. They
// are a little below the marketing sizes: the driver keeps the rest.
var presets = map[string]struct {
	name string
	mib  int64
}{
	"rtx-pro-6000": {"NVIDIA RTX PRO 6000 Blackwell", 97_887},
	"h100":         {"NVIDIA H100 80GB HBM3", 81_559},
	"h200":         {"NVIDIA H200", 143_771},
	"b200":         {"NVIDIA B200", 183_359},
	"a100-80gb":    {"NVIDIA A100-SXM4-80GB", 81_920},
	"rtx-4090":     {"NVIDIA GeForce RTX 4090", 24_564},
	"rtx-5090":     {"NVIDIA GeForce RTX 5090", 32_607},
}

// PresetNames lists the names Preset accepts.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Preset returns a known GPU by name, e.g. "h100".
func Preset(name string) (Device, error) {
	p, ok := presets[strings.ToLower(name)]
	if !ok {
		return Device{}, fmt.Errorf("unknown GPU %q: use one of %s, or give its memory with --gpu-mem", name, strings.Join(PresetNames(), ", "))
	}
	return Device{Name: p.name, Total: p.mib << 20}, nil
}

var units = map[string]float64{
	"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseSize reads a memory size with a unit: "97887MiB", "96GiB", "80GB".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	split := strings.LastIndexAny(t, "0123456789.") + 1
	num, unit := t[:split], strings.ToLower(strings.TrimSpace(t[split:]))
	scale, ok := units[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("memory size %q: want a number and a unit, like 97887MiB, 96GiB or 80GB", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || v*scale > math.MaxInt64/2 {
		return 0, fmt.Errorf("memory size %q: want a positive number before the unit", s)
	}
	return int64(v * scale), nil
}
