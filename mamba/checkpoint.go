package mamba

// CopySlot copies every GDN layer's conv and recurrent state of slot src to
// slot dst on every shard: how the prefix cache stores a checkpoint and how
// a request that reuses a prefix starts from it.
func (p *Pool) CopySlot(dst, src int) {
	for r, sh := range p.shards {
		for l := 0; l < sh.Shape.Layers; l++ {
			conv, ssm := p.Conv(r, l, dst), p.SSM(r, l, dst)
			sh.B.Copy(conv, p.Conv(r, l, src), 1, conv.Len(), 0, 0)
			sh.B.Copy(ssm, p.SSM(r, l, src), 1, ssm.Len(), 0, 0)
		}
	}
}
