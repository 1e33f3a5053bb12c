package cuda

import (
	"os"
	"strings"
	"testing"
)

// TestNewWithoutDriver checks that a machine without an NVIDIA GPU gets an
// error that says what is missing (CI has no GPU), not a crash.
func TestNewWithoutDriver(t *testing.T) {
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("this machine has a GPU: the cuda-tagged tests cover it")
	}
	be, err := New(0)
	if err == nil {
		t.Fatalf("New(0) without a GPU gave %s", be.Name())
	}
	msg := err.Error()
	if !strings.Contains(msg, "libcuda.so.1") && !strings.Contains(msg, "cuInit") && !strings.Contains(msg, "cgo") {
		t.Errorf("error %q does not say what is missing", msg)
	}
	t.Log(msg)
}
