package room

import "github.com/decodeplane/decodeplane/kvmanager/ranks"

type RankID = ranks.RankID

const addrA = "10.0.0.1:8998"
