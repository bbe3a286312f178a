package main

import (
	"fmt"
	"io"
	"strings"
)

// connectionHelp describes the flags every command takes.
const connectionHelp = `Connection (every command; flags go before or after the command name):
  --addr ADDR              daemon address: host:port, unix:///path, dns:///host:port
                           (env DECODEPLANE_ADDR; default ` + defaultAddr + `)
  --token TOKEN            the daemon's bootstrap token, sent as "authorization: Bearer"
                           (env DECODEPLANE_TOKEN); abort, drain and fleet need it when the daemon has one
  --tls                    use TLS with the system roots (implied by the flags below)
  --tls-ca FILE            CA certificates (PEM) to verify the daemon (env DECODEPLANE_TLS_CA)
  --tls-cert FILE          client certificate for mutual TLS (env DECODEPLANE_TLS_CERT)
  --tls-key FILE           its private key (env DECODEPLANE_TLS_KEY)
  --tls-server-name NAME   name to verify in the daemon's certificate (env DECODEPLANE_TLS_SERVER_NAME)
  --timeout D              bound of each call (default 10s)
  -o, --output FORMAT      text (default) or json: the daemon's answer as protojson, proto field names`

// writeUsage prints the command list.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, `decodectl — operate a decodeplane daemon (the decode-side control plane for PD-disaggregated serving)

Usage:
  decodectl COMMAND [ARGS] [FLAGS]

Commands:
`)
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-*s  %s\n", width, "help", "this help, or a command's: decodectl help COMMAND")
	fmt.Fprintf(w, "\n%s\n", connectionHelp)
	fmt.Fprint(w, `
Exit codes: 0 success, 1 the daemon answered with an error (or could not be reached), 2 usage error,
130 interrupted (Ctrl-C) during a call other than a watch.
`)
}

// writeHelp prints a command's help, or the command list for nil.
func writeHelp(w io.Writer, c *command) {
	if c == nil {
		writeUsage(w)
		return
	}
	fmt.Fprintf(w, "decodectl %s — %s\n\nUsage:\n  decodectl %s", c.name, c.summary, c.name)
	if c.synopsis != "" {
		fmt.Fprintf(w, " %s", c.synopsis)
	}
	fmt.Fprint(w, " [connection flags]\n")
	if h := strings.TrimSpace(c.help); h != "" {
		fmt.Fprintf(w, "\nFlags:\n  %s\n", h)
	}
	fmt.Fprintf(w, "\n%s\n", connectionHelp)
}
