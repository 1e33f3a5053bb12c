package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

type classRun struct {
	From   rune   `json:"from"`
	To     rune   `json:"to"`
	Qwen2  string `json:"qwen2"`
	Qwen35 string `json:"qwen35"`
}

func sig(q qwenSplitter, cp rune) string {
	c := string(cp)
	probe := "a" + c + "1" + c + " " + c + "a"
	var lens []string
	for _, p := range q.appendPieces(nil, probe) {
		lens = append(lens, strconv.Itoa(len(p)))
	}
	return strings.Join(lens, ",")
}

func TestDebugClasses(t *testing.T) {
	runs := readGoldens[classRun](t, "unicode_classes.jsonl.gz")
	bad := 0
	prev := rune(-10)
	for _, r := range runs {
		for cp := r.From; cp <= r.To; cp++ {
			if sig(qwenSplitter{}, cp) != r.Qwen2 || sig(qwenSplitter{true}, cp) != r.Qwen35 {
				bad++
				if cp != prev+1 {
					fmt.Printf("U+%04X %s/%s go %s/%s L%v M%v N%v S%v\n", cp, r.Qwen2, r.Qwen35, sig(qwenSplitter{}, cp), sig(qwenSplitter{true}, cp), unicode.IsLetter(cp), unicode.IsMark(cp), unicode.IsNumber(cp), unicode.IsSpace(cp))
				}
				prev = cp
			}
		}
	}
	fmt.Println("bad", bad)
	type nfcEntry [2]any
	nfc := readGoldens[[2]any](t, "unicode_nfc.jsonl.gz")
	want := map[rune]string{}
	for _, e := range nfc {
		want[rune(e[0].(float64))] = e[1].(string)
	}
	bad = 0
	for cp := rune(0); cp <= unicode.MaxRune; cp++ {
		if !utf8.ValidRune(cp) || cp == '|' {
			continue
		}
		w, ok := want[cp]
		if !ok {
			w = string(cp)
		}
		if g := norm.NFC.String(string(cp)); g != w {
			bad++
			if bad < 20 {
				fmt.Printf("NFC U+%04X go %q hf %q\n", cp, g, w)
			}
		}
	}
	fmt.Println("nfc bad", bad)
}
