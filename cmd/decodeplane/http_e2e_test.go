package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeCurl is one curl line of the HTTP examples of docs/http.md.
type readmeCurl struct {
	line, method, url, body string
	header                  http.Header
	background              bool
}

// readmeCurls parses the curl lines of the block after the http-examples
// marker in docs/http.md (single-quoted arguments, -X, -H, -d, -w, a
// trailing &).
func readmeCurls(t *testing.T) []readmeCurl {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "http.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "<!-- http-examples:")
	if !ok {
		t.Fatal("docs/http.md has no http-examples block")
	}
	_, block, _ := strings.Cut(after, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var out []readmeCurl
	for _, line := range strings.Split(block, "\n") {
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		c := readmeCurl{line: line, header: http.Header{}}
		args := shellWords(t, strings.TrimPrefix(line, "curl "))
		for i := 0; i < len(args); i++ {
			switch a := args[i]; {
			case a == "-s" || a == "-N":
			case a == "-w":
				i++ // the answer's format: a newline after it
			case a == "-X":
				i++
				c.method = args[i]
			case a == "-H":
				i++
				k, v, _ := strings.Cut(args[i], ": ")
				c.header.Add(k, v)
			case a == "-d":
				i++
				c.body = args[i]
			case a == "&":
				c.background = true
			case strings.HasPrefix(a, "http://"):
				c.url = a
			default:
				t.Fatalf("docs/http.md curl line %q: argument %q is not understood by this test", line, a)
			}
		}
		if c.method == "" {
			c.method = "GET"
			if c.body != "" {
				c.method = "POST" // curl -d
			}
		}
		out = append(out, c)
	}
	return out
}

// shellWords splits a line as sh does for words and single quotes.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var cur strings.Builder
	in, started := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			in, started = !in, true
		case r == ' ' && !in:
			if started {
				words = append(words, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if in {
		t.Fatalf("unbalanced quote in %q", s)
	}
	if started {
		words = append(words, cur.String())
	}
	return words
}

// TestE2EHTTPReadmeExamples runs the curl examples of docs/http.md, with
// net/http, against the real daemon serving server.http_listen, and checks
// what each answers. As in the page, the registered prefill's HTTP port is
// the daemon's own, whose /health keeps the HTTP-registered instance alive.
// (TestDocsCommands, in the repository root, runs the same block with curl
// as typed.)
func TestE2EHTTPReadmeExamples(t *testing.T) {
	curls := readmeCurls(t)
	type want struct {
		code  int
		exact string
		parts []string
	}
	wants := []want{
		{200, "OK", nil},
		{200, `{"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 64, "kv_cache_dtype": "bf16", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false, "prefill_http_port": PORT}`, nil},
		{200, "OK", nil},
		{200, `{"42": 0}`, nil}, // only the bound room, as SGLang answers
		{200, "", []string{`"rid":"req-1"`, `"room":"42"`}},
		{200, "", []string{`"rid":"req-1"`, `"phase":"ROOM_PHASE_`}},
		{200, "", []string{`"rid":"req-1"`}},
		{200, "", []string{`"room":"42"`, `"rule":"DP_RANK_RULE_SINGLE_DP"`}},
		{200, "", []string{`"version":`, `"ready":true`}},
		{401, "", []string{`"code":16`, `Unauthorized`}},
		{404, "", []string{`"code":5`, `999`}},
		{200, "", nil}, // the watch stream, checked below
		{200, "", nil},
	}
	if len(curls) != len(wants) {
		t.Fatalf("docs/http.md has %d curl examples, this test expects %d: update both together", len(curls), len(wants))
	}
	httpAddr := freeAddr(t)
	_, prefillPort, _ := net.SplitHostPort(httpAddr)
	roomsStartDaemon(t, "server:\n  auth_token: s3cret\n", "s3cret", "DECODEPLANE_SERVER_HTTP_LISTEN="+httpAddr)
	fix := func(s string) string {
		s = strings.ReplaceAll(s, "127.0.0.1:8998", httpAddr)
		return strings.ReplaceAll(s, `"prefill_http_port": 8998`, `"prefill_http_port": `+prefillPort)
	}
	send := func(c readmeCurl) *http.Response {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(fix(c.body))
		}
		req, err := http.NewRequest(c.method, fix(c.url), body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = c.header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.line, err)
		}
		return resp
	}
	var stream *http.Response
	for i, c := range curls {
		if c.background {
			stream = send(c)
			if stream.StatusCode != 200 {
				t.Fatalf("%s: status %d", c.line, stream.StatusCode)
			}
			continue
		}
		resp := send(c)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w := wants[i]
		ok := resp.StatusCode == w.code
		if w.exact != "" {
			ok = ok && string(got) == strings.ReplaceAll(w.exact, "PORT", prefillPort)
		}
		for _, p := range w.parts {
			ok = ok && strings.Contains(string(got), p)
		}
		if !ok {
			t.Errorf("docs/http.md example %d:\n  %s\nanswered %d %s\nwant %d %q %q", i, c.line, resp.StatusCode, got, w.code, w.exact, w.parts)
		}
	}
	if stream == nil {
		t.Fatal("docs/http.md has no background (streaming) example")
	}
	defer stream.Body.Close()
	// The watch stream: newline-delimited JSON, one {"result": RoomEvent}
	// per transition, ending with the terminal event of the abort.
	done := make(chan error, 1)
	var lines []string
	go func() {
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		done <- sc.Err()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch stream did not end after the room was aborted")
	}
	if len(lines) < 2 {
		t.Fatalf("watch stream = %q, want the history and the terminal event", lines)
	}
	for i, l := range lines {
		var ev struct {
			Result struct {
				Terminal bool `json:"terminal"`
				Room     struct {
					Phase   string `json:"phase"`
					Failure struct {
						Message string `json:"message"`
					} `json:"failure"`
				} `json:"room"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("stream line %d %q is not JSON: %v", i, l, err)
		}
		if last := i == len(lines)-1; ev.Result.Terminal != last {
			t.Errorf("stream line %d terminal=%v (last=%v): %s", i, ev.Result.Terminal, last, l)
		} else if last && (ev.Result.Room.Phase != "ROOM_PHASE_FAILED" || !strings.Contains(ev.Result.Room.Failure.Message, "demo")) {
			t.Errorf("last stream line %s, want the room failed with the abort's reason", l)
		}
	}
	t.Logf("watch stream: %d lines, last %s", len(lines), lines[len(lines)-1])
}
