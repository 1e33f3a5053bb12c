// Package models embeds the default model pair: a tiny Qwen3.6-architecture
// target trained on the King James Bible and a DFlash drafter distilled from
// it (see default/README.md), used when a command is given no --model.
package models

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

//go:embed default
var embedded embed.FS

// DefaultPair returns directories holding the embedded target and drafter,
// extracting them once into the user's cache directory (a directory named
// after the content hash, written to a temporary name and renamed, so a
// crash never leaves a partial model behind).
func DefaultPair() (target, draft string, err error) {
	sum, err := contentHash()
	if err != nil {
		return "", "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "ddflash", "default-"+sum[:16])
	target, draft = filepath.Join(dir, "target"), filepath.Join(dir, "draft")
	if _, err := os.Stat(dir); err == nil {
		return target, draft, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", "", fmt.Errorf("default model: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "default-extract-")
	if err != nil {
		return "", "", fmt.Errorf("default model: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := extract(tmp); err != nil {
		return "", "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !isExist(dir) {
		return "", "", fmt.Errorf("default model: %w", err)
	}
	return target, draft, nil
}

func isExist(dir string) bool {
	_, err := os.Stat(dir)
	return err == nil
}

// contentHash fingerprints every embedded file's name and bytes.
func contentHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(embedded, "default", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := embedded.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("default model: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func extract(dst string) error {
	for _, sub := range []string{"target", "draft"} {
		if _, err := fs.Stat(embedded, path.Join("default", sub, "config.json")); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("default model: this build embeds no %s (run make fixtures)", sub)
		}
	}
	return fs.WalkDir(embedded, "default", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out := filepath.Join(dst, filepath.FromSlash(p[len("default"):]))
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		data, err := embedded.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, data, 0o644)
	})
}
