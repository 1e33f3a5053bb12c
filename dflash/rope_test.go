package dflash

import (
	"ddflash/internal/closeness"
	"math"
	"testing"
)

func TestRopeFrequenciesPlainAndYaRN(t *testing.T) {
	c := &Config{HeadDim: 128, RopeTheta: 1e6}
	plain, scale := c.RopeFrequencies()
	if scale != 1 || len(plain) != 64 {
		t.Fatalf("plain RoPE: %d frequencies, scale %g", len(plain), scale)
	}
	for i, f := range plain {
		want := math.Pow(1e6, -float64(2*i)/128)
		if !closeness.Near(float64(f), want, 1e-7*want) {
			t.Fatalf("inv_freq[%d] = %g, want %g", i, f, want)
		}
	}
	c.YaRN = &YaRN{Factor: 4, OriginalMaxPositions: 32768, BetaFast: 32, BetaSlow: 1}
	yarn, scale := c.RopeFrequencies()
	if want := 0.1*math.Log(4) + 1; !closeness.Near(float64(scale), want, 1e-6) {
		t.Fatalf("attention factor %g, want %g", scale, want)
	}
	// Bounds of the ramp, from transformers' find_correction_range:
	// dim·ln(L/(β·2π)) / (2·ln θ), floored / ceiled.
	low := math.Floor(128 * math.Log(32768/(32*2*math.Pi)) / (2 * math.Log(1e6)))
	high := math.Ceil(128 * math.Log(32768/(1*2*math.Pi)) / (2 * math.Log(1e6)))
	for i := range yarn {
		ratio := float64(yarn[i] / plain[i])
		switch {
		case float64(i) <= low && !closeness.Near(ratio, 1, 1e-6):
			t.Fatalf("fast dimension %d changed by %g", i, ratio)
		case float64(i) >= high && !closeness.Near(ratio, 0.25, 1e-6):
			t.Fatalf("slow dimension %d scaled by %g, want 1/4", i, ratio)
		case !(ratio >= 0.25-1e-6 && ratio <= 1+1e-6):
			t.Fatalf("dimension %d scaled by %g, outside [1/4, 1]", i, ratio)
		}
		if i > 0 && float64(yarn[i]/plain[i]) > float64(yarn[i-1]/plain[i-1])+1e-6 {
			t.Fatalf("the ramp must only interpolate more for slower dimensions (dim %d)", i)
		}
	}
	c.YaRN.AttentionFactor = 1.5
	if _, scale := c.RopeFrequencies(); scale != 1.5 {
		t.Fatalf("explicit attention_factor ignored: %g", scale)
	}
}
