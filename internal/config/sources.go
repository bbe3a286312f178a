package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The sources a configuration is read from beyond the defaults: the YAML
// file (strict: every key known, every value typed) and the environment
// (decodeplane's DECODEPLANE_* names and SGLang's own variables, parsed as
// SGLang parses them).

// renamedError is the message for a renamed key: old and new are spelled as
// where it was found (a key, or its DECODEPLANE_* variable).
func renamedError(old, new, why string) string {
	return fmt.Sprintf("%s is deprecated and no longer read: it was renamed %s (%s). Please use %s instead.", old, new, why, new)
}

// renamedEnv finds the renamed key whose DECODEPLANE_* variable is name.
func renamedEnv(name string) (old, new, why string, ok bool) {
	for k, r := range renamedKeys {
		if envOf(k) == name {
			return envOf(k), envOf(r.to), "the key " + r.to + "; " + r.why, true
		}
	}
	return "", "", "", false
}

// envOf is the DECODEPLANE_* variable of a key.
func envOf(key string) string {
	return "DECODEPLANE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// loadFile applies a YAML file strictly: unknown keys, non-scalar leaves and
// unparsable values are errors naming the file and line.
func (l *Loaded) loadFile(path string) []error {
	data, err := os.ReadFile(path)
	if err != nil {
		return []error{fmt.Errorf("config file: %w", err)}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return []error{fmt.Errorf("config file %s: %v", path, err)}
	}
	isEmpty := func(d *yaml.Node) bool {
		return len(d.Content) == 0 || d.Content[0].Kind == yaml.ScalarNode && d.Content[0].Tag == "!!null"
	}
	for {
		// Only one document: a second one would otherwise be ignored silently.
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return []error{fmt.Errorf("config file %s: %v", path, err)}
		}
		if !isEmpty(&next) {
			return []error{fmt.Errorf("%s:%d: a second YAML document; the configuration must be a single document", path, next.Content[0].Line)}
		}
	}
	if isEmpty(&doc) {
		return nil // empty file or empty document: all defaults
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return []error{fmt.Errorf("%s:%d: the configuration must be a mapping of sections (server, transfer, kv_pool, ...)", path, root.Line)}
	}
	var errs []error
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			kn, vn := n.Content[i], n.Content[i+1]
			key := kn.Value
			if prefix != "" {
				key = prefix + "." + kn.Value
			}
			if seen[key] {
				errs = append(errs, fmt.Errorf("%s:%d: key %q is set twice", path, kn.Line, key))
				continue
			}
			seen[key] = true
			if s, ok := l.byKey[key]; ok {
				if vn.Kind != yaml.ScalarNode {
					errs = append(errs, fmt.Errorf("%s:%d: %s takes a single value, not a %s", path, vn.Line, key, nodeKind(vn)))
					continue
				}
				if vn.Tag == "!!null" {
					// "key:" with no value: an empty string for text settings
					// (e.g. metrics_listen: disables /metrics), an error otherwise.
					if s.typ.Kind() != reflect.String {
						errs = append(errs, fmt.Errorf("%s:%d: %s has no value", path, vn.Line, key))
						continue
					}
					l.field(s).SetString("")
					l.Sources[key] = fmt.Sprintf("file %s:%d", path, vn.Line)
					continue
				}
				if err := l.setString(s, vn.Value); err != nil {
					errs = append(errs, fmt.Errorf("%s:%d: %s: %v", path, vn.Line, key, err))
					continue
				}
				l.Sources[key] = fmt.Sprintf("file %s:%d", path, vn.Line)
				continue
			}
			if children := l.childrenOf(key); len(children) > 0 {
				if vn.Kind == yaml.MappingNode {
					walk(vn, key)
				} else if vn.Tag != "!!null" {
					errs = append(errs, fmt.Errorf("%s:%d: %s is a section (keys: %s), not a value", path, vn.Line, key, strings.Join(children, ", ")))
				}
				continue
			}
			if r, ok := renamedKeys[key]; ok {
				errs = append(errs, fmt.Errorf("%s:%d: %s", path, kn.Line, renamedError(key, r.to, r.why)))
				continue
			}
			allowed := l.childrenOf(prefix)
			where := "at the top level"
			if prefix != "" {
				where = "in " + prefix
			}
			errs = append(errs, fmt.Errorf("%s:%d: unknown key %q %s (allowed: %s)", path, kn.Line, kn.Value, where, strings.Join(allowed, ", ")))
		}
	}
	walk(root, "")
	return errs
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}

// childrenOf lists the direct children names of a section ("" = top level).
func (l *Loaded) childrenOf(prefix string) []string {
	var out []string
	for _, s := range l.order {
		rest, ok := strings.CutPrefix(s.key, prefix)
		if prefix != "" {
			if !ok || !strings.HasPrefix(rest, ".") {
				continue
			}
			rest = rest[1:]
		}
		name, _, _ := strings.Cut(rest, ".")
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// loadEnv applies SGLang's variables, then DECODEPLANE_* (which win).
func (l *Loaded) loadEnv(environ []string) []error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	l.env = env
	var errs []error
	for _, e := range sglangEnv {
		raw, ok := env[e.name]
		if !ok {
			continue
		}
		val, err := e.parse(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("env %s=%q: %v (it sets %s)", e.name, raw, err, e.key))
			continue
		}
		l.field(l.byKey[e.key]).Set(reflect.ValueOf(val).Convert(l.byKey[e.key].typ))
		l.Sources[e.key] = "env " + e.name
	}
	var names []string
	for k := range env {
		if strings.HasPrefix(k, "DECODEPLANE_") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	envToKey := map[string]setting{}
	for _, s := range l.order {
		envToKey[s.env] = s
	}
	for _, name := range names {
		s, ok := envToKey[name]
		if old, new, why, renamed := renamedEnv(name); !ok && renamed {
			errs = append(errs, fmt.Errorf("env %s", renamedError(old, new, why)))
			continue
		}
		if !ok {
			if !slices.Contains(nonConfigEnv, name) {
				errs = append(errs, fmt.Errorf("env %s: not a configuration variable (variables mirror the keys, e.g. DECODEPLANE_KV_POOL_KIND for kv_pool.kind)", name))
			}
			continue
		}
		if err := l.setString(s, env[name]); err != nil {
			errs = append(errs, fmt.Errorf("env %s: %v", name, err))
			continue
		}
		l.Sources[s.key] = "env " + name
	}
	return errs
}

// pyBool parses like SGLang's EnvBool.
func pyBool(s string) (any, error) {
	switch strings.ToLower(s) {
	case "true", "1", "yes", "y":
		return true, nil
	case "false", "0", "no", "n":
		return false, nil
	}
	return nil, fmt.Errorf("%q is not a valid boolean value (SGLang accepts true/1/yes/y and false/0/no/n)", s)
}

func pyStr(s string) (any, error) { return s, nil }

// pyInt parses like Python's int(): surrounding whitespace, an optional sign,
// and single underscores between digits.
func pyInt(s string) (int64, error) {
	t := strings.TrimSpace(s)
	body := strings.TrimLeft(t, "+-")
	if len(t)-len(body) > 1 || body == "" || strings.HasPrefix(body, "_") || strings.HasSuffix(body, "_") || strings.Contains(body, "__") {
		return 0, fmt.Errorf("%q is not a valid integer value", s)
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(t, "_", ""), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a valid integer value", s)
	}
	return n, nil
}

func pyIntAny(s string) (any, error) {
	n, err := pyInt(s)
	if err != nil {
		return nil, err
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return nil, fmt.Errorf("%d is out of range", n)
	}
	return int(n), nil
}

func pyIntSeconds(s string) (any, error) {
	n, err := pyInt(s)
	if err != nil {
		return nil, fmt.Errorf("%w (seconds)", err)
	}
	if n > math.MaxInt64/int64(time.Second) || n < math.MinInt64/int64(time.Second) {
		return nil, fmt.Errorf("%d seconds is out of range", n)
	}
	return time.Duration(n) * time.Second, nil
}

// pyFloat parses like Python's float() but refuses NaN and infinities.
func pyFloat(s string) (any, error) {
	t := strings.TrimSpace(s)
	if !pyFloatSyntax.MatchString(t) {
		switch strings.TrimLeft(strings.ToLower(t), "+-") {
		case "inf", "infinity", "nan":
			return nil, fmt.Errorf("%q is not finite", s)
		}
		return nil, fmt.Errorf("%q is not a valid float value", s)
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(t, "_", ""), 64)
	if err != nil {
		return nil, fmt.Errorf("%q is not a valid float value", s)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%q is not finite", s)
	}
	return f, nil
}

func pyFloatSeconds(s string) (any, error) {
	f, err := pyFloat(s)
	if err != nil {
		return nil, fmt.Errorf("%w (seconds)", err)
	}
	secs := f.(float64)
	if math.Abs(secs) > float64(math.MaxInt64)/float64(time.Second) {
		return nil, fmt.Errorf("%v seconds is out of range", secs)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
