package transfer

// HeadSlice is compute_head_slice_params's answer for one (prefill rank,
// decode rank) pair: the head slice of a Target, and of a staged
// region's writer. The registry plans destinations with it and the staging
// handler plans regions with it, so both use this one formula.
type HeadSlice struct {
	SrcHeadStart int
	DstHeadStart int
	NumHeads     int
}

// ComputeHeadSliceParams mirrors SGLang's compute_head_slice_params: which
// heads of a prefill rank (src) go to which heads of a decode rank (dst) when
// their attention TP sizes differ, with GQA replication when TP exceeds the
// KV head count.
func ComputeHeadSliceParams(srcTP, dstTP, srcRank, dstRank, totalHeads int) HeadSlice {
	srcPer := max(1, totalHeads/srcTP)
	dstPer := max(1, totalHeads/dstTP)
	if srcTP > dstTP {
		srcRepl := max(1, srcTP/totalHeads)
		return HeadSlice{
			SrcHeadStart: 0,
			DstHeadStart: ((srcRank % srcTP) / srcRepl * srcPer) % dstPer,
			NumHeads:     srcPer,
		}
	}
	dstRepl := max(1, dstTP/totalHeads)
	return HeadSlice{
		SrcHeadStart: ((dstRank % dstTP) / dstRepl * dstPer) % srcPer,
		DstHeadStart: 0,
		NumHeads:     dstPer,
	}
}
