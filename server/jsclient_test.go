package server

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"ddflash/engine"
)

// jsReply scripts the model for tools/jsclient/client.mjs.
func jsReply(r engine.Request, prompt string) string {
	switch {
	case strings.Contains(prompt, "get_weather"):
		return toolLoopReply(r, prompt)
	case strings.Contains(prompt, "Who?"):
		return "thinking\n</think>\n\nHere you go: {\"name\": \"Ann\", \"age\": 31, \"city\": \"Oslo\"} Anything else?"
	}
	return fmt.Sprintf("reason %d\n</think>\n\nanswer %d", r.Sampling.Seed, r.Sampling.Seed)
}

// TestJSClient drives the server with the official JS OpenAI client (npm
// "openai", installed in tools/jsclient by scripts/deps.sh): a tool loop
// streamed and not, the reasoning split, n = 3, json_schema, and a
// penalised completion whose fields must reach the engine.
func TestJSClient(t *testing.T) {
	dir := filepath.Join("..", "tools", "jsclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		t.Fatalf("the JS client is not installed (%v): run scripts/deps.sh", err)
	}
	h, sm := serveScripted(t, jsReply, nil)
	out, err := exec.Command("node", filepath.Join(dir, "client.mjs"), h.url).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("node client.mjs: %v\n%s", err, out)
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	last := sm.requests[len(sm.requests)-1]
	sp := last.Sampling
	if sp.PresencePenalty != 0.7 || sp.FrequencyPenalty != 0.4 || sp.LogitBias[7] != -100 || sp.Seed != 3 || sp.RepetitionPenalty != 1.1 || sp.MinP != 0.05 {
		t.Errorf("the penalised request reached the engine as %+v", sp)
	}
}
