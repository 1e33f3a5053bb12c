package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// GenerationConfig is a checkpoint's generation_config.json: extra
// end-of-sequence ids and the sampling defaults its authors recommend. A nil
// field was not in the file.
type GenerationConfig struct {
	EOS               []int32
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
}

// LoadGenerationConfig reads dir/generation_config.json; found is false when
// the file does not exist.
func LoadGenerationConfig(dir string) (g GenerationConfig, found bool, err error) {
	path := filepath.Join(dir, "generation_config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return g, false, nil
	}
	if err != nil {
		return g, false, err
	}
	var raw struct {
		EOS               json.RawMessage `json:"eos_token_id"`
		Temperature       *float64        `json:"temperature"`
		TopP              *float64        `json:"top_p"`
		TopK              *int            `json:"top_k"`
		MinP              *float64        `json:"min_p"`
		RepetitionPenalty *float64        `json:"repetition_penalty"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return g, true, fmt.Errorf("%s: %w", path, err)
	}
	g = GenerationConfig{Temperature: raw.Temperature, TopP: raw.TopP, TopK: raw.TopK, MinP: raw.MinP, RepetitionPenalty: raw.RepetitionPenalty}
	if len(raw.EOS) > 0 && string(raw.EOS) != "null" {
		// eos_token_id is one id or a list of ids.
		var one int32
		if json.Unmarshal(raw.EOS, &one) == nil {
			g.EOS = []int32{one}
		} else if err := json.Unmarshal(raw.EOS, &g.EOS); err != nil {
			return g, true, fmt.Errorf("%s: eos_token_id: want an id or a list of ids", path)
		}
	}
	return g, true, nil
}
