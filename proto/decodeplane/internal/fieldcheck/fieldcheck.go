// Package fieldcheck holds what the wire validators of decodeplane.v1 and
// decodeplane.transfer.v1 share: an error that names the field first, and
// the report of a repeated field's bad entries (the first few listed, the
// rest counted, so that a 100,000-entry request does not answer with a
// 100,000-line message).
package fieldcheck

import (
	"errors"
	"fmt"
)

// Err is "field: problem".
func Err(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
}

// MaxListed is how many bad entries of one repeated field are listed.
const MaxListed = 8

// Repeated collects the bad entries of one repeated field.
type Repeated struct {
	errs  []error
	extra int
}

// Add records err (nil is ignored).
func (r *Repeated) Add(err error) {
	if err == nil {
		return
	}
	if len(r.errs) < MaxListed {
		r.errs = append(r.errs, err)
		return
	}
	r.extra++
}

// Err joins what was recorded, with "field: N more entries are invalid"
// for the entries past MaxListed.
func (r *Repeated) Err(field string) error {
	if r.extra > 0 {
		r.errs = append(r.errs, Err(field, "%d more entries are invalid", r.extra))
	}
	return errors.Join(r.errs...)
}
