package room

import "github.com/decodeplane/decodeplane/kvmanager/registry"

type RankID = registry.RankID

const addrA = "10.0.0.1:8998"
