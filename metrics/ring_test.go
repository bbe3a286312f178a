package metrics

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvmanager"
)

func TestRingUsed(t *testing.T) {
	for _, tt := range []struct {
		name string
		w    kvmanager.Watermark
		want int64
	}{
		{"empty ring", kvmanager.Watermark{Size: 100, Round: 3, Tail: 40, HeadRound: 3, Head: 40}, 0},
		{"same round: head - tail", kvmanager.Watermark{Size: 100, Round: 2, Tail: 10, HeadRound: 2, Head: 70, Live: 2}, 60},
		{"wrapped: size - tail + head", kvmanager.Watermark{Size: 100, Round: 2, Tail: 80, HeadRound: 3, Head: 30, Live: 2}, 50},
		{"never above the size", kvmanager.Watermark{Size: 100, Round: 1, Tail: 10, HeadRound: 3, Head: 10, Live: 5}, 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ringUsed(tt.w); got != tt.want {
				t.Errorf("ringUsed(%+v) = %d, want %d", tt.w, got, tt.want)
			}
		})
	}
}
