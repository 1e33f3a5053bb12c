package device

import (
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	be, err := Open("cpu")
	if err != nil || !strings.HasPrefix(be.Name(), "cpu") {
		t.Fatalf("Open(cpu) = %v, %v", be, err)
	}
	for _, bad := range []string{"", "tpu", "cpu:1", "cuda:x", "cuda:-1"} {
		if _, err := Open(bad); err == nil {
			t.Errorf("Open(%q) succeeded, want an error", bad)
		}
	}
}
