// Package strictjson decodes outside input the way every Sluice API wants
// it: exactly one JSON value, no unknown fields, and any failure described
// as the field it concerns and a reason a client can act on.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Error names the field a document got wrong ("" for the document as a
// whole) and why.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Decode decodes data into v, rejecting unknown fields and anything after
// the value.
func Decode(data []byte, v any) *Error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the JSON value")
		}
	}
	if err == nil {
		return nil
	}
	var (
		se *json.SyntaxError
		te *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &se):
		return &Error{Reason: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)}
	case errors.As(err, &te):
		return &Error{Field: te.Field, Reason: fmt.Sprintf("want %v, got JSON %s", te.Type, te.Value)}
	case errors.Is(err, io.EOF):
		return &Error{Reason: "empty document: want a JSON value"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Reason: "truncated JSON"}
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return &Error{Field: strings.Trim(f, `"`), Reason: "unknown field"}
	}
	return &Error{Reason: strings.TrimPrefix(msg, "json: ")}
}
