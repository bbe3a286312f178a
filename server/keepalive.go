package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Keepalive, the daemon's side. A peer gone without closing its connection
// (a pulled cable, a NAT or load balancer that forgot the flow, a frozen
// host) leaves its streams open until TCP gives up, about 15 minutes on
// Linux: its sessions' claims and subscriptions stay, their goroutines too.
// The daemon pings a connection silent for KeepaliveTime and closes it
// KeepaliveTimeout after an unanswered ping. It lets clients ping as often
// as every KeepaliveMinClientTime, streams or not (grpc-go's default, 5
// minutes, would answer the Go client's 30 s pings with GOAWAY
// "too_many_pings"); 5 s, below grpc-go's 10 s floor for a client's
// keepalive, so that a client at that floor is never refused for jitter.
const (
	KeepaliveTime          = 30 * time.Second
	KeepaliveTimeout       = 10 * time.Second
	KeepaliveMinClientTime = 5 * time.Second
)

func keepaliveOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinClientTime, PermitWithoutStream: true}),
	}
}
