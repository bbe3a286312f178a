package fleet_test

import "github.com/decodeplane/decodeplane/kvmanager"

func kvmanagerRank() kvmanager.RankID { return kvmanager.RankID{Addr: prefillAddr} }
