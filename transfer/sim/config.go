package sim

import "time"

// SimConfig configures the simulated transfer engine (transfer.sim).
type SimConfig struct {
	// BandwidthGBytesPerS is the simulated bandwidth in gigabytes (10^9
	// bytes) per second (64); 0 means infinite. It was bandwidth_gbps, a name
	// that reads as gigabits; the loader refuses the old name, naming this one.
	BandwidthGBytesPerS float64 `yaml:"bandwidth_gbytes_per_s"`
	// Latency is the fixed cost of one transfer (20µs); 0 means none.
	Latency time.Duration `yaml:"latency"`
	// FailureProbability fails a chunk with this probability
	// (SGLANG_TEST_DISAGG_FAILURE_PROB); 0 disables it.
	FailureProbability float64 `yaml:"failure_probability"`
	// Seed seeds fault injection; 0 picks a random seed.
	Seed int64 `yaml:"seed"`
}
