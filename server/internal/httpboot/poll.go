package httpboot

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// Run polls every HTTP-registered instance's http://rank_ip:prefill_http_port/health
// twice per heartbeat interval (at most maxPolls at once, each bounded by
// the interval); a 200 counts as a heartbeat of all its ranks. An instance
// with no successful poll for heartbeat_max_failures × heartbeat_interval is
// declared dead by the manager, as a gRPC prefill that stops heartbeating.
// It returns ctx's error.
func (h *Routes) Run(ctx context.Context) error {
	iv, _ := h.m.HeartbeatPolicy()
	t := time.NewTicker(iv / 2)
	defer t.Stop()
	defer h.client.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			h.pollOnce(ctx, iv)
		}
	}
}

func (h *Routes) pollOnce(ctx context.Context, timeout time.Duration) {
	h.mu.Lock()
	targets := make(map[string]pollTarget, len(h.polled))
	for a, t := range h.polled {
		targets[a] = t
	}
	h.mu.Unlock()
	sem := make(chan struct{}, maxPolls)
	var wg sync.WaitGroup
	for addr, tg := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if !h.healthy(ctx, tg.url, timeout) {
				return
			}
			if !h.t.Registrar().Touch(ctx, addr, tg.instanceID) {
				h.mu.Lock()
				if h.polled[addr] == tg {
					delete(h.polled, addr) // dead or replaced: registers again to be polled again
				}
				h.mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Instances that died (no longer registered) are dropped too.
	for addr, tg := range targets {
		if _, ok := h.m.PrefillInfo(addr); !ok {
			h.mu.Lock()
			if h.polled[addr] == tg {
				delete(h.polled, addr)
			}
			h.mu.Unlock()
		}
	}
}

func (h *Routes) healthy(ctx context.Context, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Polled returns the bootstrap addresses whose /health is polled (tests,
// status).
func (h *Routes) Polled() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.polled))
	for a := range h.polled {
		out = append(out, a)
	}
	return out
}
