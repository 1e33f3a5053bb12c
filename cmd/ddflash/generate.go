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

// generateOutput is generate --json's object: the engine's result plus the decoded text.
type generateOutput struct {
	*engine.Result
	Text string `json:"text,omitempty"`
}

func runGenerate(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	var mf modelFlags
	mf.register(fs)
	mf.registerCacheDtypes(fs)
	prompt := fs.String("prompt", "", "prompt text (encoded with the model's tokenizer)")
	tokens := fs.String("tokens", "", "prompt as comma-separated token ids (instead of --prompt)")
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
	if (*prompt == "") == (*tokens == "") {
		return errors.New("give the prompt as --prompt TEXT or --tokens 1,2,3")
	}
	sizing, err := mf.unplannedSizing(1)
	if err != nil {
		return err
	}
	eng, err := mf.load(sizing)
	if err != nil {
		return err
	}
	ids, err := promptIDs(eng, *prompt, *tokens)
	if err != nil {
		return err
	}
	res, err := eng.Generate(context.Background(), engine.Request{
		Prompt: ids, MaxTokens: *maxTokens,
		Sampling: engine.SamplingParams{Temperature: *temperature, TopP: *topP, TopK: *topK, Seed: *seed, Logprobs: *logprobs},
	})
	if err != nil {
		return err
	}
	out := generateOutput{Result: res}
	if eng.Tokenizer != nil {
		if out.Text, err = eng.Tokenizer.Decode(res.Tokens, false); err != nil {
			return err
		}
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(out)
	}
	if eng.Tokenizer != nil {
		fmt.Println(out.Text)
	} else {
		fmt.Println(formatTokenList(res.Tokens))
	}
	fmt.Fprintf(os.Stderr, "%d tokens, finish %s, prefill %.1f ms, decode %.1f tok/s", len(res.Tokens), res.FinishReason, res.Stats.PrefillMs, res.Stats.DecodeTokS)
	if st := res.Stats.SpecStats; st != nil {
		fmt.Fprintf(os.Stderr, ", %s τ %.2f over %d verify steps", st.Mode, st.AcceptanceLength, st.VerifySteps)
	}
	fmt.Fprintln(os.Stderr)
	return nil
}

// promptIDs turns --prompt (through the model's tokenizer) or --tokens into ids.
func promptIDs(eng *engine.Engine, text, list string) ([]int32, error) {
	if list != "" {
		return parseTokenList(list)
	}
	if eng.Tokenizer == nil {
		return nil, errors.New("--prompt needs a tokenizer.json in the model directory; give --tokens instead")
	}
	return eng.Tokenizer.Encode(text), nil
}

func parseTokenList(s string) ([]int32, error) {
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
