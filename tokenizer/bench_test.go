package tokenizer

import (
	"flag"
	"os"
	"testing"
)

var benchCorpus = flag.String("corpus", "", "JSON-lines file of strings for BenchmarkEncode (default: the golden texts); tools/goldens/bench.sh passes one")

// BenchmarkEncode encodes every document of the corpus with the Qwen3
// tokenizer, with a cold word cache, and reports throughput in MB/s.
func BenchmarkEncode(b *testing.B) {
	docs := benchDocs(b)
	size := 0
	for _, d := range docs {
		size += len(d)
	}
	b.SetBytes(int64(size))
	for b.Loop() {
		b.StopTimer()
		tok, err := parseQwen3(false)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for _, d := range docs {
			tok.Encode(d)
		}
	}
}

func benchDocs(b *testing.B) []string {
	if *benchCorpus == "" {
		return goldenTexts(b)
	}
	f, err := os.Open(*benchCorpus)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	return readJSONLines[string](b, *benchCorpus, f)
}
