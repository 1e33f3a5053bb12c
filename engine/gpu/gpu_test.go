package gpu

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
	}{
		{"97887MiB", 97887 << 20},
		{"96GiB", 96 << 30},
		{"96 gib", 96 << 30},
		{"80GB", 80_000_000_000},
		{"1.5TiB", 3 << 39},
		{"512KiB", 512 << 10},
		{"4096B", 4096},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "96", "GiB", "96XB", "-3GiB", "0GiB", "1e30TiB", "9.9.9GiB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestPresets(t *testing.T) {
	// docs/cache-sizing.md §2: the RTX PRO 6000 Blackwell reports about 97,887 MiB.
	d, err := Preset("rtx-pro-6000")
	if err != nil || d.Total != 97887<<20 || d.Free != 0 {
		t.Errorf("rtx-pro-6000 = %+v, %v", d, err)
	}
	want := []string{"a100-80gb", "b200", "h100", "h200", "rtx-4090", "rtx-5090", "rtx-pro-6000"}
	if got := PresetNames(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("presets %v, want %v", got, want)
	}
	// Every preset reports a bit less than its nominal size, never more.
	nominalGB := map[string]int64{"a100-80gb": 80, "b200": 192, "h100": 80, "h200": 141, "rtx-4090": 24, "rtx-5090": 32, "rtx-pro-6000": 96}
	for name, gb := range nominalGB {
		d, _ := Preset(name)
		if nominal := gb << 30; d.Total > nominal || d.Total < nominal*9/10 {
			t.Errorf("%s: %d MiB is not within 90%% of its nominal %d GiB", name, d.Total>>20, gb)
		}
	}
	if _, err := Preset("v100"); err == nil || !strings.Contains(err.Error(), "--gpu-mem") || !strings.Contains(err.Error(), "h200") {
		t.Errorf("unknown GPU error %v should list presets and mention --gpu-mem", err)
	}
}

// Local must fail softly where there is no driver, and report consistent
// numbers where there is one.
func TestLocalFailsSoftly(t *testing.T) {
	d, err := Local(0)
	if err != nil {
		if !strings.Contains(err.Error(), "--gpu") {
			t.Errorf("error %q does not say what to do", err)
		}
		return
	}
	if d.Total <= 0 || d.Free < 0 || d.Free > d.Total || d.Name == "" {
		t.Errorf("NVML device %+v is inconsistent", d)
	}
}
