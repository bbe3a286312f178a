package delegate

import "time"

// DelegateConfig configures the delegated path (transfer.delegate).
type DelegateConfig struct {
	// Target is the transfer agent's gRPC address, "host:port".
	Target string `yaml:"target"`
	// BatchTimeout bounds one copy batch at the agent.
	BatchTimeout time.Duration `yaml:"batch_timeout"`
	// HealthInterval is how often the agent's health is checked.
	HealthInterval time.Duration `yaml:"health_interval"`
}
