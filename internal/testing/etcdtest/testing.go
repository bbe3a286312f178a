package etcdtest

import "testing"

// Start starts a server for t with its data in t.TempDir() and stops it
// when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New(Options{Dir: t.TempDir(), NoFsync: true, LogLevel: "fatal"}) // etcd logs errors on every Close
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
