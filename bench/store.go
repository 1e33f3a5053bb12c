package bench

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Store is a results directory. Every file in it is written atomically
// (temporary file, fsync, rename, fsync of the directory), so a crash leaves
// either the old file or the new one, never a partial one.
type Store struct{ Dir string }

const (
	sweepFile   = "sweep.json"
	traceDir    = "traces"
	tempPrefix  = ".tmp-"
	failureTail = ".failure.json"
)

func (s Store) resultPath(config string) string  { return filepath.Join(s.Dir, config+".json") }
func (s Store) failurePath(config string) string { return filepath.Join(s.Dir, config+failureTail) }

// writeAtomic replaces path with data.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s Store) writeSealed(path string, v sealed) error {
	data, err := seal(v)
	if err != nil {
		return err
	}
	return writeAtomic(path, data)
}

// WriteRecord saves a configuration's result file.
func (s Store) WriteRecord(r *Record) error { return s.writeSealed(s.resultPath(r.Config), r) }

// WriteFailure saves a configuration's failure file.
func (s Store) WriteFailure(f *Failure) error { return s.writeSealed(s.failurePath(f.Config), f) }

// ClearFailure removes a configuration's failure file once it succeeded.
func (s Store) ClearFailure(config string) error {
	err := os.Remove(s.failurePath(config))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(s.Dir)
}

// ReadRecord reads a configuration's result file; nil when there is none.
func (s Store) ReadRecord(config string) (*Record, error) {
	var r Record
	err := readSealed(s.resultPath(config), &r)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.resultPath(config), err)
	}
	return &r, nil
}

// ReadManifest reads the manifest; nil when there is none.
func (s Store) ReadManifest() (*Manifest, error) {
	var sw Manifest
	path := filepath.Join(s.Dir, sweepFile)
	err := readSealed(path, &sw)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &sw, nil
}

// WriteManifest saves the manifest.
func (s Store) WriteManifest(sw *Manifest) error {
	return s.writeSealed(filepath.Join(s.Dir, sweepFile), sw)
}

// RemoveTemps deletes temporary files that a killed writer left behind.
func (s Store) RemoveTemps() error {
	return filepath.WalkDir(s.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), tempPrefix) {
			return os.Remove(path)
		}
		return nil
	})
}

// Entries lists the configurations that have a result file and those that
// have a failure file.
func (s Store) Entries() (results, failures []string, err error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case e.IsDir() || name == sweepFile || !strings.HasSuffix(name, ".json"):
		case strings.HasSuffix(name, failureTail):
			failures = append(failures, strings.TrimSuffix(name, failureTail))
		default:
			results = append(results, strings.TrimSuffix(name, ".json"))
		}
	}
	return results, failures, nil
}

// TraceRequest is one request of a run, as the trace file keeps it.
type TraceRequest struct {
	Pass         int          `json:"pass"`
	Conversation int          `json:"conversation"`
	Turn         int          `json:"turn"`
	StartMs      float64      `json:"start_ms"` // since the pass started
	TTFTMs       float64      `json:"ttft_ms"`
	E2EMs        float64      `json:"e2e_ms"`
	Chunks       []TraceChunk `json:"chunks"`
	PromptTokens int          `json:"prompt_tokens"`
	OutputTokens int          `json:"output_tokens"`
	Finish       string       `json:"finish_reason"`
	Tokens       []int32      `json:"tokens"`
	Text         string       `json:"text"`
	Spec         *SpecStat    `json:"spec"`
}

// TraceChunk is one streamed chunk: when it arrived and how many tokens it held.
type TraceChunk struct {
	Ms     float64 `json:"ms"` // since the request started
	Tokens int     `json:"tokens"`
}

// SpecStat is one request's speculation, when the backend reports it per request.
type SpecStat struct {
	AcceptanceLength float64 `json:"acceptance_length"`
	VerifySteps      int     `json:"verify_steps"`
}

// WriteTrace saves a run's requests as zstd-compressed JSON lines and
// returns the reference the record keeps.
func (s Store) WriteTrace(config string, key RunKey, reqs []TraceRequest) (*TraceFile, error) {
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	for i := range reqs {
		if err := enc.Encode(&reqs[i]); err != nil {
			return nil, err
		}
	}
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		return nil, err
	}
	data := zw.EncodeAll(raw.Bytes(), nil)
	zw.Close()
	rel := filepath.Join(traceDir, config, key.String()+".jsonl.zst")
	path := filepath.Join(s.Dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := writeAtomic(path, data); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &TraceFile{File: filepath.ToSlash(rel), SHA256: hex.EncodeToString(sum[:])}, nil
}

// ReadTrace checks a trace file against its reference and decodes it.
func (s Store) ReadTrace(t *TraceFile) ([]TraceRequest, error) {
	data, err := os.ReadFile(filepath.Join(s.Dir, filepath.FromSlash(t.File)))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != t.SHA256 {
		return nil, fmt.Errorf("trace %s: %w", t.File, errChecksum)
	}
	zr, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	dec := json.NewDecoder(zr)
	dec.DisallowUnknownFields()
	var out []TraceRequest
	for {
		var r TraceRequest
		err := dec.Decode(&r)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: %v", t.File, err)
		}
		out = append(out, r)
	}
}
