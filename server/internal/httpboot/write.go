package httpboot

// The answers, as SGLang's aiohttp server writes them.

import (
	"io"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// httpStatusOf maps a gRPC code to the HTTP status of the bootstrap routes.
func httpStatusOf(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted, codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499
	}
	return http.StatusInternalServerError
}

func writeStatus(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	writeText(w, httpStatusOf(st.Code()), st.Message())
}

// writeText answers a text body as aiohttp's web.Response(text=...).
func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// writeJSON answers a JSON body as aiohttp's web.json_response.
func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// pyObject writes a flat JSON object the way Python's json.dumps does by
// default (", " and ": " separators, ensure_ascii), so that a byte-exact
// comparison with SGLang's server sees the same bytes.
type pyObject struct{ b []byte }

func (o *pyObject) key(k string) {
	if len(o.b) == 0 {
		o.b = append(o.b, '{')
	} else {
		o.b = append(o.b, ", "...)
	}
	o.b = pyQuote(o.b, k)
	o.b = append(o.b, ": "...)
}

func (o *pyObject) int(k string, v int64) { o.key(k); o.b = strconv.AppendInt(o.b, v, 10) }

func (o *pyObject) str(k, v string)       { o.key(k); o.b = pyQuote(o.b, v) }
func (o *pyObject) bool(k string, v bool) { o.key(k); o.b = strconv.AppendBool(o.b, v) }

func (o *pyObject) close() []byte {
	if len(o.b) == 0 {
		return []byte("{}")
	}
	return append(o.b, '}')
}

// pyQuote appends s as json.dumps(ensure_ascii=True) quotes it.
func pyQuote(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20 || r >= 0x80:
			if r > 0xffff {
				r -= 0x10000
				hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
				b = append(b, '\\', 'u', hex[hi>>12], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
				r = lo
			}
			b = append(b, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}
