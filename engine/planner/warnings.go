package planner

import (
	"fmt"
	"strconv"

	"ddflash/mamba"
)

// snapshotWarnBytes is where per-token snapshots become worth pointing out.
const snapshotWarnBytes = 1 << 30

// warnings says in plain words what limits the plan.
func (p *Plan) warnings(maxPositions int) []string {
	k := p.Settings
	w := []string{} // an empty list, not null, in JSON
	if p.shortfall != "" {
		w = append(w, "does not fit: "+p.shortfall)
	}
	if mr := p.MaxRunning; mr.KVCap < mr.Requested && mr.KVCap >= 1 {
		w = append(w, fmt.Sprintf("KV cache holds %s tokens: only %d %s of %s tokens fit, fewer than the %d requested",
			FormatCount(p.KVTokens), mr.KVCap, plural(mr.KVCap, "request"), FormatCount(int64(k.Context)), mr.Requested))
	}
	if mr := p.MaxRunning; mr.SlotCap < mr.Requested && k.Mode == ModeSGLang {
		w = append(w, fmt.Sprintf("%d Mamba slots at %d per request cap running requests at %d, below the %d requested; snapshots are still reserved for %d requests × %d draft tokens (%s)",
			p.StateSlots, p.SlotsPerRequest, mr.SlotCap, mr.Requested, p.RollbackRequests, p.DraftTokens,
			FormatBytes(int64(p.RollbackRequests)*p.Bytes.RollbackPerRequest)))
	}
	snapshots := int64(p.RollbackRequests) * p.Bytes.RollbackPerRequest
	if (k.Mode == ModeSGLang || k.Rollback == mamba.Snapshot) && snapshots >= snapshotWarnBytes {
		replay := int64(p.RollbackRequests) * rollbackBytes(mamba.Replay, p.state, k, p.DraftTokens)
		w = append(w, fmt.Sprintf("per-token state snapshots take %s (%s KV tokens); replaying from saved inputs (ddflash --rollback replay) needs %s",
			FormatBytes(snapshots), FormatCount(snapshots/p.Bytes.PerKVToken), FormatBytes(replay)))
	}
	if k.Context > maxPositions {
		w = append(w, fmt.Sprintf("context %s is longer than the model's %s positions", FormatCount(int64(k.Context)), FormatCount(int64(maxPositions))))
	}
	if k.SSMDtype != FP32 && p.DraftTokens > 0 {
		w = append(w, fmt.Sprintf("%s recurrent state: speculative outputs can drift from fp32 decoding and acceptance can drop (the reference keeps fp32)", k.SSMDtype.Name))
	}
	if headroom := p.segment("runtime headroom (activations, CUDA graphs)"); k.Mode == ModeSGLang && headroom < 0 {
		w = append(w, fmt.Sprintf("the draft KV pool (%s) is larger than SGLang's runtime headroom: expect out-of-memory errors under load", FormatBytes(p.segment("draft KV cache"))))
	}
	return w
}

func (p *Plan) segment(use string) int64 {
	for _, s := range p.Memory {
		if s.Use == use {
			return s.Bytes
		}
	}
	return 0
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// FormatBytes writes a size in binary units with two decimals: "146.81 MiB".
func FormatBytes(n int64) string {
	units := []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}
	for _, u := range units {
		if n >= u.size || -n >= u.size {
			return fmt.Sprintf("%.2f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// FormatCount writes an integer with thousands separators: "11,893".
func FormatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return sign + s
}
