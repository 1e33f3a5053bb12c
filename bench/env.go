package bench

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"
)

// Version and Commit name the build. Set them with -ldflags
// "-X ddflash/bench.Version=v1.2.3 -X ddflash/bench.Commit=$(git rev-parse HEAD)";
// otherwise they come from the build info (the module version, and the VCS
// stamp of a build from a git checkout unless -buildvcs=false).
var Version, Commit = "", ""

// ReadBinary describes the running executable: version, VCS commit (Go
// stamps it into builds from a git checkout) and the file's own hash.
func ReadBinary() (Binary, error) {
	b := Binary{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" {
			b.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = cmp.Or(b.Commit, s.Value)
			case "vcs.time":
				b.CommitTime = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return b, fmt.Errorf("find the running executable to hash it: %w", err)
	}
	if b.SHA256, _, err = hashFile(exe); err != nil {
		return b, err
	}
	return b, nil
}

// ReadHost describes this machine; gpus come from NVML when present.
func ReadHost(gpus GPUReader) Host {
	h := Host{OS: runtime.GOOS, Arch: runtime.GOARCH, Cores: runtime.NumCPU(), CPU: cpuModel()}
	h.Hostname, _ = os.Hostname()
	info, err := gpus.Info()
	if err != nil {
		h.GPUNote = err.Error()
		return h
	}
	h.GPUs, h.Driver = info.GPUs, info.Driver
	return h
}

// cpuModel is /proc/cpuinfo's first "model name"; empty where there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// HashCheckpoint hashes every regular file of a model directory (not
// hidden, not in subdirectories), in parallel, and combines the names and
// hashes into one checkpoint hash.
func HashCheckpoint(dir string) (*Checkpoint, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, fmt.Errorf("hash checkpoint: %w", err)
	}
	var files []FileSum
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, FileSum{Name: e.Name()})
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("hash checkpoint: %s holds no files", abs)
	}
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for i := range files {
		g.Go(func() error {
			var err error
			files[i].SHA256, files[i].Size, err = hashFile(filepath.Join(abs, files[i].Name))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("hash checkpoint: %w", err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s  %s\n", f.SHA256, f.Name) // sha256sum's line format
	}
	return &Checkpoint{Path: abs, SHA256: hex.EncodeToString(h.Sum(nil)), Files: files}, nil
}

func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
