package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// finishedSweep returns a results directory holding one valid configuration.
func finishedSweep(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := serverSweep(t, &fakeServer{tokenIDs: true}, chatPlan(t, "b15", 1, 6, 1, 2), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func verifyProblem(t *testing.T, dir string) (Finding, string) {
	t.Helper()
	v, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v.Print(&out)
	if v.OK() || len(v.Findings) != 1 {
		t.Fatalf("verify passed or found %d configurations:\n%s", len(v.Findings), out.String())
	}
	return v.Findings[0], out.String()
}

func mustWrite(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestVerifyDetectsDamage(t *testing.T) {
	record := func(dir string) string { return filepath.Join(dir, "tp1-b15.json") }
	for _, c := range []struct {
		name    string
		damage  func(t *testing.T, dir string)
		problem string
	}{
		{"truncated", func(t *testing.T, dir string) {
			data := mustRead(t, record(dir))
			mustWrite(t, record(dir), data[:len(data)/2])
		}, "truncated or damaged"},
		{"edited number", func(t *testing.T, dir string) {
			data := mustRead(t, record(dir))
			edited := bytes.Replace(data, []byte(`"completed": 6`), []byte(`"completed": 7`), 1)
			if bytes.Equal(edited, data) {
				t.Fatal("nothing to edit")
			}
			mustWrite(t, record(dir), edited)
		}, "checksum mismatch"},
		{"unknown field", func(t *testing.T, dir string) {
			data := mustRead(t, record(dir))
			mustWrite(t, record(dir), bytes.Replace(data, []byte(`"complete":`), []byte(`"extra": 1, "complete":`), 1))
		}, "unknown field"},
		{"other schema", func(t *testing.T, dir string) {
			data := mustRead(t, record(dir))
			mustWrite(t, record(dir), bytes.Replace(data, []byte(ResultSchema), []byte("ddflash.bench.result/v0"), 1))
		}, `schema "ddflash.bench.result/v0"`},
		{"trace tampered", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "traces", "tp1-b15", "chat-6tok-c1.jsonl.zst")
			data := mustRead(t, p)
			data[len(data)-1] ^= 1
			mustWrite(t, p, data)
		}, "trace traces/tp1-b15/chat-6tok-c1.jsonl.zst: checksum mismatch"},
		{"trace missing", func(t *testing.T, dir string) {
			if err := os.RemoveAll(filepath.Join(dir, "traces")); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
		{"result missing", func(t *testing.T, dir string) {
			if err := os.Remove(record(dir)); err != nil {
				t.Fatal(err)
			}
		}, "no result file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := finishedSweep(t)
			c.damage(t, dir)
			f, out := verifyProblem(t, dir)
			if f.Config != "tp1-b15" || !strings.Contains(f.Problem, c.problem) {
				t.Errorf("finding %+v, want a problem mentioning %q", f, c.problem)
			}
			if !strings.Contains(out, "to rerun: tp1-b15") || !strings.Contains(out, "--resume") {
				t.Errorf("no rerun advice:\n%s", out)
			}
			if f.Damaged != strings.Contains(out, "rm "+record(dir)) {
				t.Errorf("damaged=%v but the advice is:\n%s", f.Damaged, out)
			}
		})
	}
}

func TestVerifyNotesLeftoverTemporaries(t *testing.T) {
	dir := finishedSweep(t)
	tmp := filepath.Join(dir, tempPrefix+"tp1-b15.json-123")
	mustWrite(t, tmp, []byte(`{"schema":`))
	v, err := Verify(dir)
	if err != nil || !v.OK() || len(v.Temps) != 1 {
		t.Fatalf("verify with a leftover temporary: %+v, %v", v, err)
	}
	if _, err := serverSweep(t, &fakeServer{tokenIDs: true}, chatPlan(t, "b15", 1, 6, 1, 2), dir); err == nil {
		t.Error("a second sweep into a used directory without --resume was accepted")
	}
}

func TestResumeRefusesDamageAndDifferentSetups(t *testing.T) {
	backend, url := openFake(t, &fakeServer{tokenIDs: true})
	sweep := func(dir string, plan *Plan, seed uint64, resume bool) error {
		_, err := Sweep(t.Context(), Options{Plan: plan, Backend: backend, Store: Store{Dir: dir}, Resume: resume,
			Argv: []string{"ddflash", "bench", "--url", url}, IgnoreEOS: true, Seed: seed, GPUs: &fakeGPUs{}})
		return err
	}
	resume := func(dir string, plan *Plan, seed uint64) error { return sweep(dir, plan, seed, true) }
	dir := t.TempDir()
	if err := sweep(dir, chatPlan(t, "b15", 1, 6, 1, 2), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := resume(dir, chatPlan(t, "b15", 1, 6, 1, 2), 0); err != nil {
		t.Errorf("resume with the same setup: %v", err)
	}
	if err := resume(dir, chatPlan(t, "b15", 1, 6, 1, 2), 7); err == nil || !strings.Contains(err.Error(), "setup.knobs.seed") {
		t.Errorf("resume with another seed: %v", err)
	}
	if err := resume(dir, chatPlan(t, "b15", 1, 8, 1, 2), 0); err == nil || !strings.Contains(err.Error(), "different sweep") {
		t.Errorf("resume with other lengths: %v", err)
	}
	rec := filepath.Join(dir, "tp1-b15.json")
	mustWrite(t, rec, mustRead(t, rec)[:100])
	if err := resume(dir, chatPlan(t, "b15", 1, 6, 1, 2), 0); err == nil || !strings.Contains(err.Error(), "delete that file") {
		t.Errorf("resume over a truncated record: %v", err)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"--out":           "--out",
		"/tmp/a b":        "'/tmp/a b'",
		"it's":            `'it'\''s'`,
		"fibonacci,chat":  "fibonacci,chat",
		"http://h:8000/x": "http://h:8000/x",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// sameServer runs every mode of a plan on one fake server, as an in-process
// sweep would, so that one directory holds a baseline and speculative modes.
type sameServer struct{ *OpenAI }

func (sameServer) Validate(*Plan) error { return nil }

// lossySweep returns a finished sweep of auto, b15 and linear whose b15
// record reports outputs other than the baseline's on one run, as a lossy
// engine would write it (a valid, sealed record).
func lossySweep(t *testing.T, temperature float64) string {
	t.Helper()
	dir := t.TempDir()
	backend, url := openFake(t, &fakeServer{tokenIDs: true})
	_, err := Sweep(t.Context(), Options{Plan: testPlan(t, "auto,b15,linear", "chat", []int{6}, []int{1, 2}, 1),
		Backend: sameServer{backend}, Store: Store{Dir: dir}, Argv: []string{"ddflash", "bench", "--url", url},
		IgnoreEOS: true, Temperature: temperature, GPUs: &fakeGPUs{}})
	if err != nil {
		t.Fatal(err)
	}
	st := Store{Dir: dir}
	rec, err := st.ReadRecord("tp1-b15")
	if err != nil {
		t.Fatal(err)
	}
	rec.Runs[1].OutputsSHA256 = strings.Repeat("0", 64)
	if err := st.WriteRecord(rec); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerifyFailsOnLossySpeculation(t *testing.T) {
	v, err := Verify(lossySweep(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v.Print(&out)
	if v.OK() {
		t.Fatalf("verify passed a greedy mode whose outputs differ from autoregressive:\n%s", out.String())
	}
	for _, f := range v.Findings {
		if lossy := f.Config == "tp1-b15"; f.Lossy != lossy || f.OK == lossy {
			t.Errorf("finding %+v", f)
		}
	}
	if !strings.Contains(out.String(), "LOSSY  tp1-b15") || !strings.Contains(out.String(), "chat-6tok-c2") ||
		strings.Contains(out.String(), "chat-6tok-c1") || strings.Contains(out.String(), "to rerun") {
		t.Errorf("verify output names the wrong runs or advises a rerun:\n%s", out.String())
	}
}

func TestVerifyComparesOnlyGreedyOutputs(t *testing.T) {
	v, err := Verify(lossySweep(t, 0.7))
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK() {
		var out bytes.Buffer
		v.Print(&out)
		t.Errorf("sampled outputs differ by chance, yet verify failed:\n%s", out.String())
	}
}
