package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/decodeplane/decodeplane/proto/decodeplane/v1" // registers the descriptors walked below
	"github.com/decodeplane/decodeplane/server"
)

// The JSON gateway over the real server and manager, on a loopback socket.
func newGatewayServer(t *testing.T, token string) string {
	t.Helper()
	m, dec := newManager(t, 1, nil)
	cfg := server.DefaultConfig()
	cfg.AuthToken = token
	srv, err := server.New(cfg, server.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Layout: dec.Layout(), TransferPath: "sim", Manager: m})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetReady(true, "serving")
	gw, err := srv.NewJSONGateway()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	gw.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx, m.Shutdown); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return hs.URL
}

func gwCall(t *testing.T, ctx context.Context, method, url, auth, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), err
}

// TestGatewayServesEveryRPC walks the proto's services: every method is
// routed, the mutating ones reach the auth interceptor (401, gRPC code 16,
// nothing stored) without a token, and the reads answer from their handler;
// the bidirectional streams (EngineSession.Session, PrefillSession.Session),
// which grpc-gateway cannot map, are walked too and must have no route.
func TestGatewayServesEveryRPC(t *testing.T) {
	url := newGatewayServer(t, "gw-token")
	routeMiss := `{"code":5,"message":"Not Found","details":[]}`
	n := 0
	for _, svc := range []string{"Admin", "Bootstrap", "Rooms", "Staging", "Fleet", "Capacity", "EngineSession", "PrefillSession"} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName("decodeplane.v1." + svc))
		if err != nil {
			t.Fatal(err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			md := methods.Get(i)
			n++
			full := "/decodeplane.v1." + svc + "/" + string(md.Name())
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			code, body, err := gwCall(t, ctx, "POST", url+full, "", "{}")
			cancel()
			streaming := md.IsStreamingServer()
			if md.IsStreamingClient() {
				if err != nil || code != http.StatusNotFound {
					t.Errorf("%s (a bidi stream) = %d %s %v, want 404: not routed", full, code, body, err)
				}
				continue
			}
			switch {
			case md.IsStreamingClient():
				// Not even mounted (JSONGateway.Register): the HTTP mux's 404.
				if err != nil || code != http.StatusNotFound {
					t.Errorf("%s (a client stream) = %d %s, %v; want no route", full, code, body, err)
				}
			case err != nil && streaming && errors.Is(err, context.DeadlineExceeded):
				// A stream that waits for events: routed and running.
			case err != nil:
				t.Errorf("%s: %v", full, err)
			case body == routeMiss || code == http.StatusNotFound && strings.TrimSpace(body) == "Not Found":
				t.Errorf("%s is not routed: %d %s", full, code, body)
			case mutating(full) && (code != http.StatusUnauthorized || !strings.Contains(body, `"code":16`)):
				t.Errorf("%s without a token = %d %s, want 401 with gRPC code 16", full, code, body)
			}
		}
	}
	if n != 32 {
		t.Errorf("walked %d RPCs; the proto has 32: update the test with the API", n)
	}
}

// mutating reports the methods that need the token: every one but the
// reads below (Fleet.GetFleet is a read that needs it: fleet.proto).
func mutating(full string) bool {
	switch full {
	case "/decodeplane.v1.Admin/GetStatus", "/decodeplane.v1.Bootstrap/LookupDPRanks", "/decodeplane.v1.Rooms/GetRoom",
		"/decodeplane.v1.Rooms/ListRooms", "/decodeplane.v1.Rooms/WatchRoom", "/decodeplane.v1.Staging/WatchWatermark",
		"/decodeplane.v1.Staging/SetupStaging":
		return false
	}
	return true
}

// TestGatewayErrorsAndAuth: the gRPC status becomes the HTTP status and a
// JSON body, with the handler's message; the token travels as
// Authorization and is checked by the same interceptor.
func TestGatewayErrorsAndAuth(t *testing.T) {
	url := newGatewayServer(t, "gw-token")
	ctx := t.Context()
	type errBody struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	check := func(what string, code int, body string, wantHTTP, wantCode int, inMsg string) {
		t.Helper()
		var e errBody
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != wantHTTP || e.Code != wantCode || !strings.Contains(e.Message, inMsg) {
			t.Errorf("%s = %d %s, want %d with code %d and %q", what, code, body, wantHTTP, wantCode, inMsg)
		}
	}
	reg := `{"bootstrap_addr": "10.0.0.1:8998", "rank_endpoint": "10.0.0.1:17000", "parallel": {"attn_tp_size": 1, "pp_size": 1}, "page_size": 16, "kv_cache_dtype": "bf16"}`
	code, body, _ := gwCall(t, ctx, "POST", url+"/decodeplane.v1.Bootstrap/RegisterPrefill", "", reg)
	check("RegisterPrefill without a token", code, body, 401, 16, "Unauthorized")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Bootstrap/RegisterPrefill", "bearer wrong", reg)
	check("RegisterPrefill with a wrong token", code, body, 401, 16, "Unauthorized")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Bootstrap/RegisterPrefill", "BEARER gw-token", reg)
	if code != 200 || !strings.Contains(body, `"expected_ranks":1`) {
		t.Errorf("RegisterPrefill with the token = %d %s", code, body)
	}
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Bootstrap/RegisterPrefill", "Bearer gw-token", strings.Replace(reg, `"page_size": 16`, `"page_size": 32`, 1))
	check("RegisterPrefill with another page size", code, body, 400, 9, "Page size mismatch")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Bootstrap/LookupDPRanks", "", `{"rooms": ["1"]}`)
	check("LookupDPRanks without an address", code, body, 400, 3, "bootstrap_addr: is required")
	code, body, _ = gwCall(t, ctx, "GET", url+"/v1/rooms/77", "", "")
	check("GET /v1/rooms/77", code, body, 404, 5, "77")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Rooms/OpenRoom", "Bearer gw-token", `{"rid": "r", "bootstrap_addr": "10.0.0.1:8998", "room": "9223372036854775808", "prompt_len": 1, "max_new_tokens": 1}`)
	check("OpenRoom with a room beyond 2^63-1", code, body, 400, 3, "room: 9223372036854775808 is out of range")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Rooms/OpenRoom", "Bearer gw-token", `{"rid": 5}`)
	check("OpenRoom with a number for a string", code, body, 400, 3, "rid")
	code, body, _ = gwCall(t, ctx, "POST", url+"/decodeplane.v1.Rooms/OpenRoom", "Bearer gw-token", `{"rid": "`+strings.Repeat("x", server.MaxGatewayBodyBytes)+`"}`)
	check("OpenRoom with a body over MaxGatewayBodyBytes", code, body, 400, 3, "too large")
	code, body, _ = gwCall(t, ctx, "GET", url+"/v1/status", "", "")
	if code != 200 || !strings.Contains(body, `"ready":true`) {
		t.Errorf("GET /v1/status = %d %s", code, body)
	}
	code, body, _ = gwCall(t, ctx, "GET", url+"/v1/fleet", "", "")
	check("GET /v1/fleet without a token", code, body, 401, 16, "Unauthorized")
	code, body, _ = gwCall(t, ctx, "GET", url+"/v1/fleet", "Bearer gw-token", "")
	var fleet struct {
		Registry struct{ Backend, State string }
		Prefills []struct {
			BootstrapAddr string `json:"bootstrap_addr"`
		}
	}
	if err := json.Unmarshal([]byte(body), &fleet); err != nil || code != 200 || fleet.Registry.Backend != "memory" || fleet.Registry.State != "ok" ||
		len(fleet.Prefills) != 1 || fleet.Prefills[0].BootstrapAddr != "10.0.0.1:8998" {
		t.Errorf("GET /v1/fleet with the token = %d %s (%v); want the memory registry and the prefill registered above", code, body, err)
	}
}
