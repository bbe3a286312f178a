package main

import (
	"errors"
	"net"
	"strings"
)

// sdNotify sends state (e.g. "READY=1") to the service manager's
// notification socket, $NOTIFY_SOCKET in environ, as systemd's sd_notify(3)
// does: one datagram on a unixgram socket, a leading '@' naming an abstract
// socket (Go's net package maps it to the leading NUL). Without
// NOTIFY_SOCKET (not under systemd, or a unit that is not Type=notify) it
// does nothing and returns nil.
func sdNotify(environ []string, state string) error {
	path := notifySocket(environ)
	if path == "" {
		return nil
	}
	if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "@") {
		return errors.New("NOTIFY_SOCKET " + path + ": not an absolute path nor an abstract socket (@name)")
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// notifySocket is the last NOTIFY_SOCKET in environ ("" if unset).
func notifySocket(environ []string) string {
	v := ""
	for _, kv := range environ {
		if s, ok := strings.CutPrefix(kv, "NOTIFY_SOCKET="); ok {
			v = s
		}
	}
	return v
}
