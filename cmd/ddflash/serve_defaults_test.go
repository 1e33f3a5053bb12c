package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeSamplingDefaults reads Qwen3.6's generation_config.json (as
// published; see server/testdata) under --generation-config auto and none,
// and checks the defaults returned and the start-up log line.
func TestServeSamplingDefaults(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("..", "..", "server", "testdata", "qwen3.6-27b", "generation_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"auto", "none"} {
		var buf bytes.Buffer
		c := serveConfig{generationConfig: mode}
		c.model.model = dir
		g, err := c.samplingDefaults(slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
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
	for _, args := range [][]string{{"--reasoning-parser", "deepseek"}, {"--tool-call-parser", "hermes"}, {"--generation-config", "vllm"}} {
		if err := serve(context.Background(), args, nil); err == nil || !strings.Contains(err.Error(), args[1]) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
