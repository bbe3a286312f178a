// Package delegate is the delegated transfer engine (transfer.path:
// delegate): DelegateEngine implements transfer.Engine, transfer.Scatterer
// and transfer.ChunkChecker by turning each chunk (TransferBatch) and each
// staged region (ScatterBatch) into a kvcopy.Batch and submitting it to an
// external transfer agent through the Agent interface, which
// transfer/agentclient implements over gRPC and transfer/hostmem in process.
//
// It owns the agent's readiness (Run: a health check at once and every
// DelegateConfig.HealthInterval, re-registering the decode buffers of
// DelegateDeps.Buffers; OnReadiness is told every change), the decode
// engine's layouts at the agent (RegisterLayout; each registered again on
// every health check, and dropped when the agent refuses its memory: the
// engine exited), the per-batch
// deadline (DelegateConfig.BatchTimeout) and the mapping of the agent's
// answers onto the transfer package's errors: a batch the agent failed is
// transfer.ErrTransferFailed, an unreachable agent (ErrAgentUnreachable:
// nothing was submitted) is transfer.ErrEngineUnavailable, and an agent
// lost with the batch in flight (ErrAgentLost) is a
// transfer.WritesMayContinueError until the batch's deadline. DelegateConfig
// is the transfer.delegate section of the configuration.
package delegate
