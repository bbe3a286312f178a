package kvmanager

import (
	"log/slog"
	"strconv"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// The manager's log lines about rooms go through its storm logger
// (internal/stormlog): what happens to many rooms at once (a prefill lost
// with its rooms queued, an abort storm, a shutdown, drains that expire
// together) writes one line per cause per interval with the count and a few
// room ids, not one line per room. A room's own account stays in its
// events, its trace and GetRoom (decodectl room).

// roomFailed logs a room's failure. Its cause is the failure code and the
// prefill's bootstrap address; the first failure of a quiet cause is logged
// at once with the room, its rid, the phase it failed in and the reason.
func (m *Manager) roomFailed(e *entry, f *Failure, from Phase) {
	id := e.ID()
	m.storm.Log(e.logCtx(), slog.LevelWarn, "room failed",
		[]slog.Attr{slog.String("code", f.Code.String()), slog.String("bootstrap_addr", e.Addr())}, strconv.FormatUint(id, 10),
		slog.Uint64("room", id), slog.String("rid", e.Request().RID), slog.String("phase", from.String()), slog.String("reason", f.Message))
}

// roomNote logs one line about a room under the cause msg + the room's
// bootstrap address (+ cause).
func (m *Manager) roomNote(e *entry, level slog.Level, msg string, cause []slog.Attr, detail ...slog.Attr) {
	id := e.ID()
	m.storm.Log(e.logCtx(), level, msg, append([]slog.Attr{slog.String("bootstrap_addr", e.Addr())}, cause...), strconv.FormatUint(id, 10),
		append([]slog.Attr{slog.Uint64("room", id)}, detail...)...)
}

// drainNotes logs and counts what the room's drain did.
func (sh *shard) drainNotes(e *entry, ef *room.Effects) {
	m := sh.m
	if !ef.QuarantineUntil.IsZero() {
		m.roomNote(e, slog.LevelWarn, "room's pages held until the transfer agent's deadline", nil, slog.Time("until", ef.QuarantineUntil))
	}
	d := ef.Drain
	switch {
	case ef.DrainStarted:
		m.roomNote(e, slog.LevelInfo, "room's pages draining until its prefill ranks acknowledge", nil,
			slog.Any("attempt", d.Attempt), slog.String("ranks", room.RankList(d.Ranks)), slog.Time("until", d.Until))
	case ef.DrainExpired:
		m.roomNote(e, slog.LevelWarn, "room's pages released without every prefill rank's acknowledgement: release.deferred_timeout expired",
			[]slog.Attr{slog.Duration("deferred_timeout", m.cfg.Release.DeferredTimeout)},
			slog.Any("attempt", d.Attempt), slog.String("ranks", room.RankList(d.Ranks)))
		m.obs.RoomEndAcks("expired", len(d.Ranks))
	}
	if ef.Acked {
		m.obs.RoomEndAcks("acked", 1)
		if ef.AckResult.Released {
			m.roomNote(e, slog.LevelInfo, "room's pages released: every prefill rank acknowledged", nil, slog.Any("attempt", d.Attempt), slog.Int("acks", d.Acks))
		}
	}
}
