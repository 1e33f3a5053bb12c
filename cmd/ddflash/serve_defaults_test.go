package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"ddflash/engine"
)

// TestServeSamplingDefaults takes Qwen3.6's generation_config.json (as
// published; see server/testdata) as the engine reads it, under
// --generation-config auto and none, and checks the defaults returned and
// the start-up log line. serve reads no file itself: the model directory
// here has none.
func TestServeSamplingDefaults(t *testing.T) {
	gen, found, err := engine.LoadGenerationConfig(filepath.Join("..", "..", "server", "testdata", "qwen3.6-27b"))
	if err != nil || !found {
		t.Fatalf("Qwen's generation_config.json: found %v, %v", found, err)
	}
	for _, mode := range []string{"auto", "none"} {
		var buf bytes.Buffer
		c := serveConfig{generationConfig: mode}
		c.model.model = t.TempDir()
		g := c.samplingDefaults(&gen, slog.New(slog.NewTextHandler(&buf, nil)))
		log := buf.String()
		switch mode {
		case "auto":
			if g.Temperature == nil || *g.Temperature != 1 || g.TopP == nil || *g.TopP != 0.95 || g.TopK == nil || *g.TopK != 20 || g.MinP != nil || g.EOS != nil {
				t.Errorf("auto: defaults %+v", g)
			}
			if !strings.Contains(log, "temperature=1 top_p=0.95 top_k=20") {
				t.Errorf("auto: log %q", log)
			}
		case "none":
			if g.Temperature != nil || g.TopP != nil || g.TopK != nil || !strings.Contains(log, "OpenAI's") {
				t.Errorf("none: defaults %+v, log %q", g, log)
			}
		}
	}
	if len(gen.EOS) == 0 {
		t.Errorf("the engine's eos list was cleared: %+v", gen)
	}
	var buf bytes.Buffer
	c := serveConfig{generationConfig: "auto"}
	if g := c.samplingDefaults(nil, slog.New(slog.NewTextHandler(&buf, nil))); g.Temperature != nil || !strings.Contains(buf.String(), "OpenAI's") {
		t.Errorf("auto without a generation_config.json: defaults %+v, log %q", g, buf.String())
	}
	for _, args := range [][]string{{"--reasoning-parser", "deepseek"}, {"--tool-call-parser", "hermes"}, {"--generation-config", "vllm"}} {
		if err := serve(context.Background(), args, nil); err == nil || !strings.Contains(err.Error(), args[1]) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
