package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"ddflash/engine"
)

func init() {
	register("generate", "generate a completion for one prompt", runGenerate)
}

func runGenerate(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	tokens := fs.String("tokens", "", "prompt as comma-separated token ids")
	maxTokens := fs.Int("max-tokens", 64, "maximum number of new tokens")
	temperature := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topP := fs.Float64("top-p", 1, "nucleus sampling mass")
	topK := fs.Int("top-k", 0, "sample among the k most likely tokens (0: all)")
	seed := fs.Uint64("seed", 0, "random seed")
	logprobs := fs.Int("logprobs", 0, "report the top-N log-probabilities per step")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := fs.Parse(args); err != nil {
		return err
	}
	prompt, err := parseTokenList(*tokens)
	if err != nil {
		return err
	}
	eng, err := mf.load(1)
	if err != nil {
		return err
	}
	res, err := eng.Generate(context.Background(), engine.Request{
		Prompt: prompt, MaxTokens: *maxTokens,
		Sampling: engine.SamplingParams{Temperature: *temperature, TopP: *topP, TopK: *topK, Seed: *seed, Logprobs: *logprobs},
	}, nil)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		return enc.Encode(res)
	}
	fmt.Println(formatTokenList(res.Tokens))
	fmt.Fprintf(os.Stderr, "%d tokens, finish %s, prefill %.1f ms, decode %.1f tok/s\n",
		len(res.Tokens), res.FinishReason, res.Stats.PrefillMs, res.Stats.DecodeTokS)
	return nil
}

func parseTokenList(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("give a prompt with --tokens 1,2,3")
	}
	var out []int32
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q is not a token id", f)
		}
		out = append(out, int32(v))
	}
	return out, nil
}

func formatTokenList(ids []int32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(int(id))
	}
	return strings.Join(parts, ",")
}
