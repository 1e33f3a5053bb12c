package bench

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Workload is a set of conversations; each conversation is a list of user
// turns, sent one after another with the model's replies in between (the
// z-lab/dflash mt-bench convention).
type Workload struct {
	Name          string
	Source        string // "builtin" or the JSONL file it came from
	Conversations [][]string
	// System, when set, is a system prompt every conversation starts with.
	System string
}

// builtins are short so they fit the tiny test model's 256-token context
// with a few dozen output tokens; real models get the same text.
var builtins = []*Workload{
	{Name: "fibonacci", Source: "builtin", Conversations: [][]string{{
		"Write a Python function fibonacci(n) that returns the n-th Fibonacci number with an iterative loop. Add a docstring.",
	}}},
	{Name: "math", Source: "builtin", Conversations: [][]string{
		{"A baker sells muffins for $3 and cookies for $1.50. Maya buys 4 muffins and 6 cookies. How much does she pay?"},
		{"A train covers 180 km in 2.5 hours. At the same speed, how far does it go in 4 hours? Reason step by step."},
	}},
	{Name: "prose", Source: "builtin", Conversations: [][]string{{
		"Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night.",
	}}},
	{Name: "chat", Source: "builtin", Conversations: [][]string{{
		"Hi! I am visiting Kyoto in April.",
		"What should I pack?",
		"Suggest one day trip.",
	}}},
	// multiturn is the prefix cache's workload: a long system prompt that
	// every conversation shares, and four turns per conversation, each
	// resending the conversation so far. It needs a model with a context
	// of a few thousand tokens.
	{Name: "multiturn", Source: "builtin", System: multiturnSystem(), Conversations: [][]string{
		{"Summarise the handbook's rules on deliveries.", "Which of them apply on Sundays?", "Draft a notice about it.", "Make the notice shorter."},
		{"What does the handbook say about the river path?", "Who maintains it?", "List the tools they need.", "Which tool costs most?"},
		{"Explain the morning checklist.", "Why does step three come first?", "What if it rains?", "Write it as a poem."},
		{"How are new staff trained?", "How long does that take?", "Who signs them off?", "Suggest one improvement."},
	}},
}

// multiturnSystem is a handbook of 64 numbered rules, 3,560 characters:
// 2,035 tokens with the test models' small tokenizer (testmodel presets),
// fewer with a real model's (about 800 with Qwen's). It is made from a fixed
// recipe so the workload's hash is stable.
func multiturnSystem() string {
	subjects := []string{"the farmer", "the river keeper", "the night guard", "the baker", "the ferry pilot", "the gardener", "the archivist"}
	actions := []string{"checks the gate", "records the weather", "counts the crates", "sweeps the path", "lights the lamps", "waters the trees", "locks the shed"}
	times := []string{"before sunrise", "at noon", "every evening", "after rain", "on market days", "once a week", "when the bell rings"}
	var b strings.Builder
	b.WriteString("You are the assistant of a small river town. Answer from this handbook.\n")
	for i := range 64 {
		fmt.Fprintf(&b, "Rule %d: %s %s %s.\n", i+1, subjects[i%7], actions[(i/7)%7], times[(i*3)%7])
	}
	return b.String()
}

// BuiltinNames lists the built-in workloads.
func BuiltinNames() []string {
	names := make([]string, len(builtins))
	for i, w := range builtins {
		names[i] = w.Name
	}
	return names
}

var workloadName = regexp.MustCompile(`^[a-z0-9][a-z0-9_]*$`)

// LoadWorkloads resolves --workloads: built-in names, or paths to JSONL
// files in the z-lab format (one {"turns": [...]} per line), named after the
// file. limit > 0 keeps each workload's first limit conversations.
func LoadWorkloads(list string, limit int) ([]*Workload, error) {
	var out []*Workload
	for _, item := range splitList(list) {
		w, err := loadWorkload(item, limit)
		if err != nil {
			return nil, err
		}
		for _, o := range out {
			if o.Name == w.Name {
				return nil, fmt.Errorf("--workloads: two workloads are named %q; rename one file", w.Name)
			}
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--workloads: give at least one of %s or a .jsonl file", strings.Join(BuiltinNames(), ", "))
	}
	return out, nil
}

func loadWorkload(item string, limit int) (*Workload, error) {
	if !strings.HasSuffix(item, ".jsonl") {
		for _, w := range builtins {
			if w.Name == item {
				if limit > 0 && limit < len(w.Conversations) {
					cut := *w
					cut.Conversations = w.Conversations[:limit]
					return &cut, nil
				}
				return w, nil
			}
		}
		return nil, fmt.Errorf("--workloads: unknown workload %q: choose from %s, or give a .jsonl file of {\"turns\": [...]} lines",
			item, strings.Join(BuiltinNames(), ", "))
	}
	name := strings.ToLower(strings.TrimSuffix(filepath.Base(item), ".jsonl"))
	name = strings.NewReplacer("-", "_", ".", "_", " ", "_").Replace(name)
	if !workloadName.MatchString(name) {
		return nil, fmt.Errorf("%s: the workload is named after the file, and %q is not a usable name (letters, digits, _)", item, name)
	}
	f, err := os.Open(item)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	convs, err := parseTurns(f, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", item, err)
	}
	return &Workload{Name: name, Source: item, Conversations: convs}, nil
}

func parseTurns(f *os.File, limit int) ([][]string, error) {
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<26)
	var convs [][]string
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var rec struct {
			Turns []string `json:"turns"`
		}
		if err := json.Unmarshal([]byte(text), &rec); err != nil {
			return nil, fmt.Errorf("line %d: want {\"turns\": [\"...\"]}: %v", line, err)
		}
		if len(rec.Turns) == 0 {
			return nil, fmt.Errorf("line %d: \"turns\" is missing or empty", line)
		}
		for i, t := range rec.Turns {
			if strings.TrimSpace(t) == "" {
				return nil, fmt.Errorf("line %d: turn %d is empty", line, i+1)
			}
		}
		convs = append(convs, rec.Turns)
		if limit > 0 && len(convs) == limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(convs) == 0 {
		return nil, fmt.Errorf("no conversations: want one {\"turns\": [...]} per line")
	}
	return convs, nil
}

// Turns is the number of user turns over all conversations.
func (w *Workload) Turns() int {
	n := 0
	for _, c := range w.Conversations {
		n += len(c)
	}
	return n
}

// Info describes the workload in a record; the hash ties results to the text.
func (w *Workload) Info() WorkloadInfo {
	var text any = w.Conversations
	if w.System != "" {
		text = []any{w.System, w.Conversations}
	}
	data, _ := json.Marshal(text) // strings always marshal
	sum := sha256.Sum256(data)
	return WorkloadInfo{Name: w.Name, Source: w.Source, Conversations: len(w.Conversations), Turns: w.Turns(), SHA256: hex.EncodeToString(sum[:])}
}

// passConversations is what one measured pass sends at a concurrency: every
// conversation, cycled so that at least concurrency are in flight.
func (w *Workload) passConversations(concurrency int) [][]string {
	n := max(len(w.Conversations), concurrency)
	out := make([][]string, n)
	for i := range out {
		out[i] = w.Conversations[i%len(w.Conversations)]
	}
	return out
}
