package planner

import (
	"fmt"
	"math"

	"ddflash/mamba"
)

// SGLang mode reproduces how SGLang sizes its pools for a hybrid model with
// speculative decoding, in the variant that fits the reported deployment
// (docs/cache-sizing.md §6.2): the mid-2026 "V2 joint solve" with D = budget+1 = 16
// draft tokens, r = 4 Mamba slots per running request, the automatic
// mem_fraction_static (≈0.761 on an RTX PRO 6000) and S = 24 slots from
// --max-mamba-cache-size. Each step below names the SGLang code it models.

// sglangOtherStaticBytes is what SGLang allocates between loading the weights
// and profiling free memory (cuBLAS workspace, allocator rounding and the
// like). Fitted with cudaContextBytes; the doc estimates about 0.25 GiB.
const sglangOtherStaticBytes = 234 << 20

// sglangCapacityDefaults models server_args' _handle_gpu_memory_settings:
// chunked_prefill_size and the decode CUDA-graph max batch size by GPU size.
func sglangCapacityDefaults(totalMiB float64, tp int) (chunkedPrefill, graphMaxBS float64) {
	big := tp >= 4
	switch {
	case totalMiB < 20*1024:
		return 2048, 8
	case totalMiB < 35*1024:
		return 4096, pick(big, 160, 48)
	case totalMiB < 60*1024:
		return 4096, pick(big, 160, 32)
	case totalMiB < 160*1024:
		return 8192, pick(big, 512, 256)
	default:
		return 16384, 512
	}
}

func pick(cond bool, yes, no float64) float64 {
	if cond {
		return yes
	}
	return no
}

// sglangPiecewiseGraphSizes counts the piecewise prefill CUDA graphs SGLang
// captures (generate_prefill_cuda_graph_batch_sizes up to the chunk size);
// each reserves 8 MiB.
func sglangPiecewiseGraphSizes(maxTokens float64) int {
	steps := []struct{ from, to, step float64 }{
		{4, 32, 4}, {48, 256, 16}, {288, 512, 32}, {576, 1024, 64}, {1280, 4096, 256}, {4608, maxTokens, 512},
	}
	n := 0
	for _, s := range steps {
		for v := s.from; v <= s.to && v <= maxTokens; v += s.step {
			n++
		}
	}
	return n
}

// sglangAutoMemFraction models the automatic mem_fraction_static
// (docs/cache-sizing.md §2): reserve activation, graph and parallel headroom,
// 2 GiB more for speculation, round to three decimals, then shrink for a
// vision tower (adjust_mem_fraction_for_vlm, with L its depth).
func sglangAutoMemFraction(total int64, tp int, spec bool, v Vision) float64 {
	gpuMiB := float64(total) / (1 << 20)
	chunk, graphBS := sglangCapacityDefaults(gpuMiB, tp)
	reserved := 512 + 1.5*max(chunk, 2048) + float64(tp)/8*1024 +
		2*graphBS + 8*float64(sglangPiecewiseGraphSizes(chunk))
	if gpuMiB > 60*1024 {
		reserved = max(reserved, 10*1024)
	}
	if spec {
		reserved += 2048
	}
	mfs := math.Round((gpuMiB-reserved)/gpuMiB*1000) / 1000
	if v.Layers == 0 {
		return mfs
	}
	complexity := float64(v.Layers) * float64(v.Hidden) * float64(v.Hidden) / (24 * 1024 * 1024)
	return mfs * 0.95 * min(1.05, max(0.8, 1-0.1*(complexity-1)))
}

// sglangSlotsPerRequest is r (_calculate_mamba_ratio): 1 without a radix
// cache; otherwise 3 plus the extra-buffer ping-pong slots, 2 with the overlap
// scheduler and 1 without it (DDTree turns overlap off, PR #29907).
func sglangSlotsPerRequest(k Knobs) int {
	switch {
	case k.DisableRadixCache:
		return 1
	case k.Spec == SpecDDTree:
		return 4
	default:
		return 5
	}
}

// planSGLang follows profile_max_num_token and handle_max_mamba_cache.
func (p *Plan) planSGLang(m Models, k Knobs) {
	free := k.freeBeforeLoad()
	preLoadFree := free - cudaContextBytes
	p.MemFraction = k.MemFraction
	if p.MemFraction == 0 {
		p.MemFraction = sglangAutoMemFraction(k.GPUTotal, k.TP, k.Spec != SpecAutoregressive, m.Target.Vision)
	}
	b := p.Bytes
	// Newer rule (_profile_available_bytes): rest = free_now −
	// pre_model_load_free·(1−mfs), with target and draft weights loaded.
	static := int64(float64(preLoadFree) * p.MemFraction)
	p.CacheBudget = static - b.TargetWeights - b.DraftWeights - sglangOtherStaticBytes

	r := sglangSlotsPerRequest(k)
	p.SlotsPerRequest = r
	d := p.DraftTokens
	switch {
	case k.MaxMambaCacheSize > 0:
		p.StateSlots = k.MaxMambaCacheSize
	case k.DisableRadixCache:
		p.StateSlots = k.MaxRunningRequests
	default:
		// V2 ratio split: slots and their intermediate snapshots share
		// M = R·m/(1+m).
		budget := float64(p.CacheBudget) * k.MambaFullMemoryRatio / (1 + k.MambaFullMemoryRatio)
		p.StateSlots = max(0, int(budget/(float64(b.PerStateSlot)*(1+float64(d)/float64(r)))))
	}
	p.MaxRunning.SlotCap = p.StateSlots / r
	// V2 intermediate cache: one snapshot per draft token for
	// min(mrr, S // r) requests, however many were asked for.
	p.RollbackRequests = min(k.MaxRunningRequests, p.MaxRunning.SlotCap)
	states := int64(p.StateSlots) * b.PerStateSlot
	snapshots := int64(p.RollbackRequests) * b.RollbackPerRequest
	kvBudget := p.CacheBudget - states - snapshots

	// DFLASH (not DDTree) inflates the KV cell by the draft layers
	// (scale_kv_cell_size_per_token_for_dflash); the reported DDTree numbers
	// show no inflation, so its draft pool comes out of the runtime headroom.
	cell := b.PerKVToken
	if k.Spec == SpecLinear {
		t, ld := int64(m.Target.Config.NumFull()), int64(m.Drafter.NumLayers)
		cell = (b.PerKVToken*(t+ld) + t - 1) / t
	}
	p.KVTokens = max(0, kvBudget/cell)
	draftKV := p.KVTokens * b.DraftKVPerToken // draft_runner_cache_size = max_total_num_tokens
	headroom := preLoadFree - static
	if k.Spec == SpecLinear {
		draftKV = p.KVTokens * (cell - b.PerKVToken)
	} else {
		headroom -= draftKV
	}
	switch {
	case p.StateSlots <= 0:
		p.shortfall = fmt.Sprintf("SGLang would stop at start-up: no memory for Mamba slots (%s left for KV and Mamba): pass --max-mamba-cache-size or a larger --mem-fraction-static", FormatBytes(p.CacheBudget))
	case kvBudget < 0:
		p.shortfall = fmt.Sprintf("%d Mamba slots and snapshots for %d requests (%s) exceed the %s SGLang leaves for KV and Mamba: lower --max-mamba-cache-size or --max-running-requests",
			p.StateSlots, p.RollbackRequests, FormatBytes(states+snapshots), FormatBytes(p.CacheBudget))
	}
	p.Memory = []Segment{
		{"CUDA context", cudaContextBytes},
		{"other processes", k.GPUTotal - free},
		{"runtime headroom (activations, CUDA graphs)", headroom},
		{"target weights", b.TargetWeights},
		{"draft weights", b.DraftWeights},
		{"other static allocations", sglangOtherStaticBytes},
		{"KV cache", p.KVTokens * b.PerKVToken},
		{"draft KV cache", draftKV},
		{"GDN state slots", states},
		{rollbackUse(mamba.Snapshot), snapshots},
	}
	p.closeMemory(k.GPUTotal)
}
