package bench

// GPUReader reads the local GPUs: their fixed description for the record's
// host, and their state (clocks, temperature, power, memory) around each run.
type GPUReader interface {
	Info() (GPUSet, error)
	States() ([]GPUState, error)
}

// GPUSet is the GPUs and their driver.
type GPUSet struct {
	GPUs   []GPUInfo
	Driver string
}

// telemetry reads the GPU state, or says why it cannot.
func telemetry(r GPUReader) ([]GPUState, string) {
	s, err := r.States()
	if err != nil {
		return nil, err.Error()
	}
	return s, ""
}
