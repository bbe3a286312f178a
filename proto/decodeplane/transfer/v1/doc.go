// Package transferv1 is the generated Go code of decodeplane.transfer.v1:
// TransferAgent, the contract an external GPU transfer service implements
// for decodeplane's delegated transfer path, plus hand-written Validate
// methods. The byte layouts the copies use are documented in agent.proto.
package transferv1
