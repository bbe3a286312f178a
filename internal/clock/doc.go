// Package clock is the injected source of time shared by the room manager
// (kvmanager) and the transfer engines (transfer/sim, transfer/delegate):
// the Clock interface, RealClock (the wall clock, which is the virtual
// clock inside a testing/synctest bubble), Sleep on a Clock and a Ticker
// driven by one. It is a leaf: it imports only the standard library.
package clock
