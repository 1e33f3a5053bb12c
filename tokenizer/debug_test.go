package tokenizer

import (
	"fmt"
	"os"
	"testing"
	"unicode"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"
)

func TestDebugCCC(t *testing.T) {
	versions := []string{"9.0.0", "10.0.0", "11.0.0", "12.0.0", "13.0.0", "15.0.0"}
	f, _ := os.Create("/tmp/tk/ccc.txt")
	defer f.Close()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		c := norm.NFD.PropertiesString(string(r)).CCC()
		if c == 0 {
			continue
		}
		v := "old"
		for _, ver := range versions {
			if unicode.Is(rangetable.Assigned(ver), r) {
				v = ver
				break
			}
		}
		fmt.Fprintf(f, "%d %d %s\n", r, c, v)
	}
}
