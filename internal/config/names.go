package config

// Keys lists every configuration key the loader knows (file, env, flags).
func Keys() []string {
	var out []string
	for _, s := range settings() {
		out = append(out, s.key)
	}
	return out
}

// EnvNames lists every environment variable the loader reads: the
// DECODEPLANE_* variable of each key, SGLang's variables and the
// variables of the other commands (DECODEPLANE_CONFIG, decodectl's).
func EnvNames() []string {
	var out []string
	for _, s := range settings() {
		out = append(out, s.env)
	}
	for _, e := range sglangEnv {
		out = append(out, e.name)
	}
	return append(out, nonConfigEnv...)
}
