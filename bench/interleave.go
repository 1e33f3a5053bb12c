package bench

import "context"

// interleaved measures degree tp's configurations run by run, the passes
// of each run in turn across them (every configuration's first pass, then
// every second pass, ...), each configuration opened for its pass. On a
// machine whose load changes while the sweep runs, every configuration of
// a run meets the same load, so their ratios hold; configuration by
// configuration, a burst of load lands on one of them.
func (s *sweeper) interleaved(ctx context.Context, tp int) error {
	fails := map[string]*Failure{}
	for _, m := range s.o.Plan.Modes {
		name := ConfigName(tp, m)
		fails[name] = &Failure{Head: Head{Schema: FailureSchema, Config: name, Setup: s.setup(tp, m), Argv: s.o.Argv}}
	}
	for _, key := range s.o.Plan.Runs() {
		var cells []*cell
		end := s.progress.position()
		for _, m := range s.o.Plan.Modes {
			if !s.records[ConfigName(tp, m)].has(key) {
				cells = append(cells, &cell{mode: m})
				end += s.runUnits(key)
			}
		}
		for range s.o.Plan.Repeats {
			for _, c := range cells {
				if err := s.interleavedPass(ctx, tp, key, c); err != nil {
					return err
				}
			}
		}
		for _, c := range cells {
			s.progress.finish(end)
			var run *measuredRun
			rf := c.failure
			if rf == nil {
				run, rf = c.run.finish()
			}
			if err := s.keep(tp, c.mode, fails[ConfigName(tp, c.mode)], run, rf); err != nil {
				return err
			}
		}
	}
	for name, f := range fails {
		if len(f.Failures) == 0 {
			if err := s.o.Store.ClearFailure(name); err != nil {
				return err
			}
		}
	}
	return nil
}

// cell is one configuration's run in an interleaved sweep: in progress, or
// failed.
type cell struct {
	mode    Mode
	run     *measuring
	failure *RunFailure
}

// interleavedPass opens the cell's configuration and measures its next
// pass, warming up first on its first. A cell that failed is skipped.
func (s *sweeper) interleavedPass(ctx context.Context, tp int, key RunKey, c *cell) error {
	if c.failure != nil || (c.run != nil && c.run.firstErr != nil) {
		return nil
	}
	s.progress.begin(ConfigName(tp, c.mode) + " " + key.String())
	t, err := s.o.Backend.Open(tp, c.mode)
	if err != nil {
		c.failure = &RunFailure{RunKey: key, At: now(), Error: err.Error()}
		return nil
	}
	defer t.Close()
	if c.run == nil {
		if c.run, c.failure, err = s.startRun(ctx, t, key); c.run == nil {
			return err
		}
	}
	return c.run.pass(ctx, t)
}
