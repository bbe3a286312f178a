package kvlayout

import "fmt"

// Invalid is a request field with a bad value, as the domain reports it
// (the room manager, the prefill registry, the staging handler and the
// transfer engines share this one type, so that it crosses package lines
// unchanged and the inbound API answers it as InvalidArgument naming Field).
type Invalid struct {
	Field string
	Msg   string
}

func (e *Invalid) Error() string { return e.Field + ": " + e.Msg }

// Invalidf is an *Invalid for field with a formatted message.
func Invalidf(field, format string, args ...any) error {
	return &Invalid{Field: field, Msg: fmt.Sprintf(format, args...)}
}
