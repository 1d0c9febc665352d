package rls

import (
	"errors"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluice-rl/sluice/quota"
)

// request is a RateLimitRequest as the service reads it: decoded from the
// wire by decodeRequest, or copied from a message by fromMessage. Its
// strings and entries are its own; reset keeps their room for the next.
//
// It keeps at most keptDescriptors descriptors and keptEntries entries of
// each, and only counts the rest: validation refuses any request past
// either limit, and needs no more to say by how much. A 1 MiB message of
// empty descriptors would otherwise hold half a million of them, tens of
// megabytes kept in the pooled room after the call.
type request struct {
	domain     string
	hitsAddend uint32
	descs      []reqDescriptor
	entries    []quota.DescriptorEntry // of every kept descriptor, in turn
	moreDescs  int                     // descriptors counted, not kept
}

const (
	keptDescriptors = MaxDescriptors + 1
	keptEntries     = quota.MaxDescriptorEntries + 1
)

// descriptors is how many descriptors the request carried.
func (r *request) descriptors() int { return len(r.descs) + r.moreDescs }

// reqDescriptor is one descriptor of a request, not yet validated.
type reqDescriptor struct {
	entries     []quota.DescriptorEntry
	moreEntries int  // entries counted, not kept
	null        bool // a nil message in a request built in process
	hasLimit    bool // a limit override was sent
	negative    bool // is_negative_hits
	hasHits     bool // hits_addend was sent; hits is its value
	hits        uint64
	// The limit override, when hasLimit: requests_per_unit, unit (an
	// envoy.type.v3.RateLimitUnit) and unit_multiplier when hasMult.
	limitRPU, limitUnit, limitMult uint64
	hasMult                        bool
}

// entryCount is how many entries the descriptor carried.
func (d *reqDescriptor) entryCount() int { return len(d.entries) + d.moreEntries }

func (r *request) reset() {
	r.domain, r.hitsAddend, r.moreDescs = "", 0, 0
	r.descs, r.entries = r.descs[:0], r.entries[:0]
}

// fromMessage fills r from m, as decodeRequest would from m's encoding.
func (r *request) fromMessage(m *rlsv3.RateLimitRequest) {
	r.reset()
	r.domain, r.hitsAddend = m.GetDomain(), m.GetHitsAddend()
	for _, d := range m.GetDescriptors() {
		if len(r.descs) == keptDescriptors {
			r.moreDescs++
			continue
		}
		first := len(r.entries)
		rd := reqDescriptor{null: d == nil, hasLimit: d.GetLimit() != nil, negative: d.GetIsNegativeHits()}
		for _, e := range d.GetEntries() {
			if len(r.entries)-first == keptEntries {
				rd.moreEntries++
				continue
			}
			r.entries = append(r.entries, quota.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if l := d.GetLimit(); l != nil {
			rd.limitRPU, rd.limitUnit = uint64(l.GetRequestsPerUnit()), uint64(uint32(l.GetUnit()))
			if m := l.GetUnitMultiplier(); m != nil {
				rd.hasMult, rd.limitMult = true, uint64(m.GetValue())
			}
		}
		if h := d.GetHitsAddend(); h != nil {
			rd.hasHits, rd.hits = true, h.GetValue()
		}
		rd.entries = r.entries[first:len(r.entries):len(r.entries)]
		r.descs = append(r.descs, rd)
	}
}

var errMalformed = errors.New("malformed RateLimitRequest")

// Field numbers of the messages decodeRequest reads (rls.proto and
// ratelimit.proto of envoy's API).
const (
	fieldRequestDomain      = 1
	fieldRequestDescriptors = 2
	fieldRequestHitsAddend  = 3

	fieldDescriptorEntries        = 1
	fieldDescriptorLimit          = 2
	fieldDescriptorHitsAddend     = 3
	fieldDescriptorIsNegativeHits = 4

	fieldEntryKey   = 1
	fieldEntryValue = 2

	fieldUInt64Value = 1
)

// decodeRequest decodes a RateLimitRequest's protobuf encoding into r,
// with the semantics of proto.Unmarshal: unknown fields, and known ones of
// another wire type, are skipped; the last of a repeated scalar wins;
// strings must be UTF-8. r's strings share one copy of b.
func decodeRequest(b []byte, r *request) error {
	r.reset()
	s := string(b) // the strings of r are substrings of it
	type span struct{ first, end int }
	var spansBuf [fewDescriptors]span
	spans := spansBuf[:0]
	for off := 0; off < len(b); {
		f, err := nextField(b, &off)
		if err != nil {
			return err
		}
		switch {
		case f.num == fieldRequestDomain && f.typ == protowire.BytesType:
			if !utf8.Valid(f.v) {
				return errMalformed
			}
			r.domain = f.str(s)
		case f.num == fieldRequestHitsAddend && f.typ == protowire.VarintType:
			r.hitsAddend = uint32(f.x)
		case f.num == fieldRequestDescriptors && f.typ == protowire.BytesType:
			first := len(r.entries)
			d, err := r.decodeDescriptor(f.v, f.str(s))
			if err != nil {
				return err
			}
			if len(r.descs) == keptDescriptors {
				// Decoded all the same: a malformed one fails the request.
				r.entries = r.entries[:first]
				r.moreDescs++
				continue
			}
			r.descs = append(r.descs, d)
			spans = append(spans, span{first, len(r.entries)})
		}
	}
	// r.entries may have moved while growing: the slices are taken last.
	for i, sp := range spans {
		r.descs[i].entries = r.entries[sp.first:sp.end:sp.end]
	}
	return nil
}

// decodeDescriptor decodes a RateLimitDescriptor, b, whose copy is s; its
// entries are appended to r.entries.
func (r *request) decodeDescriptor(b []byte, s string) (reqDescriptor, error) {
	var d reqDescriptor
	first := len(r.entries)
	for off := 0; off < len(b); {
		f, err := nextField(b, &off)
		if err != nil {
			return d, err
		}
		switch {
		case f.num == fieldDescriptorEntries && f.typ == protowire.BytesType:
			e, err := decodeEntry(f.v, f.str(s))
			if err != nil {
				return d, err
			}
			if len(r.entries)-first == keptEntries {
				d.moreEntries++
				continue
			}
			r.entries = append(r.entries, e)
		case f.num == fieldDescriptorLimit && f.typ == protowire.BytesType:
			if !validMessage(f.v) {
				return d, errMalformed
			}
			d.hasLimit = true
			if err := decodeOverride(f.v, &d); err != nil {
				return d, err
			}
		case f.num == fieldDescriptorHitsAddend && f.typ == protowire.BytesType:
			d.hasHits = true
			if err := decodeUInt64Value(f.v, &d.hits); err != nil {
				return d, err
			}
		case f.num == fieldDescriptorIsNegativeHits && f.typ == protowire.VarintType:
			d.negative = f.x != 0
		}
	}
	return d, nil
}

// decodeEntry decodes a RateLimitDescriptor.Entry, b, whose copy is s.
func decodeEntry(b []byte, s string) (quota.DescriptorEntry, error) {
	var e quota.DescriptorEntry
	for off := 0; off < len(b); {
		f, err := nextField(b, &off)
		if err != nil {
			return e, err
		}
		if (f.num == fieldEntryKey || f.num == fieldEntryValue) && f.typ == protowire.BytesType {
			if !utf8.Valid(f.v) {
				return e, errMalformed
			}
			if f.num == fieldEntryKey {
				e.Key = f.str(s)
			} else {
				e.Value = f.str(s)
			}
		}
	}
	return e, nil
}

// decodeUInt64Value merges a google.protobuf.UInt64Value, b, into v.
func decodeUInt64Value(b []byte, v *uint64) error {
	for off := 0; off < len(b); {
		f, err := nextField(b, &off)
		if err != nil {
			return err
		}
		if f.num == fieldUInt64Value && f.typ == protowire.VarintType {
			*v = f.x
		}
	}
	return nil
}

// decodeOverride decodes a RateLimitDescriptor.RateLimitOverride, b,
// into d's limit fields.
func decodeOverride(b []byte, d *reqDescriptor) error {
	for off := 0; off < len(b); {
		f, err := nextField(b, &off)
		if err != nil {
			return err
		}
		switch {
		// Both are 32-bit fields: a longer varint is truncated, as
		// proto.Unmarshal truncates it.
		case f.num == 1 && f.typ == protowire.VarintType:
			d.limitRPU = uint64(uint32(f.x))
		case f.num == 2 && f.typ == protowire.VarintType:
			d.limitUnit = uint64(uint32(f.x))
		case f.num == 3 && f.typ == protowire.BytesType:
			d.hasMult = true
			if err := decodeUInt64Value(f.v, &d.limitMult); err != nil {
				return err
			}
			d.limitMult = uint64(uint32(d.limitMult))
		}
	}
	return nil
}

// wireField is one field of a message: its number and wire type, and its
// value when a varint (x) or length-delimited (v, at offset at of the
// message); a field of another type is passed over.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	x   uint64
	v   []byte
	at  int
}

// str is f's bytes as a substring of s, the message's copy.
func (f wireField) str(s string) string { return s[f.at : f.at+len(f.v)] }

// nextField reads the field of b at *off and moves *off past it; a field
// cut short, or a number proto.Unmarshal refuses, is errMalformed.
func nextField(b []byte, off *int) (wireField, error) {
	num, typ, n := consumeTag(b[*off:])
	if n < 0 {
		return wireField{}, errMalformed
	}
	*off += n
	f := wireField{num: num, typ: typ}
	switch typ {
	case protowire.VarintType:
		f.x, n = protowire.ConsumeVarint(b[*off:])
	case protowire.BytesType:
		f.v, n = protowire.ConsumeBytes(b[*off:])
		f.at = *off + n - len(f.v)
	default:
		n = protowire.ConsumeFieldValue(num, typ, b[*off:])
	}
	if n < 0 {
		return wireField{}, errMalformed
	}
	*off += n
	return f, nil
}

// validMessage reports whether b is a well-formed sequence of fields, as
// a message the service does not read must be for the request to decode.
// Its strings are not checked for UTF-8: RateLimitOverride has none.
func validMessage(b []byte) bool {
	for off := 0; off < len(b); {
		num, typ, n := consumeTag(b[off:])
		if n < 0 {
			return false
		}
		off += n
		if n = protowire.ConsumeFieldValue(num, typ, b[off:]); n < 0 {
			return false
		}
		off += n
	}
	return true
}

// consumeTag is protowire.ConsumeTag, refusing the field numbers above
// protowire.MaxValidNumber that proto.Unmarshal refuses too.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}

// appendResponse appends the protobuf encoding of r, byte for byte what
// proto.Marshal writes, for the fields decide sets: overall_code, the
// statuses (code, current_limit's requests_per_unit, unit and name,
// limit_remaining, duration_until_reset), response_headers_to_add and
// request_headers_to_add (key and value). Any other field of r must be
// unset.
func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	if r.OverallCode != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.OverallCode))
	}
	for _, st := range r.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeStatus(st)))
		b = appendStatus(b, st)
	}
	b = appendHeaders(b, 3, r.ResponseHeadersToAdd)
	return appendHeaders(b, 4, r.RequestHeadersToAdd)
}

func appendHeaders(b []byte, num protowire.Number, hs []*corev3.HeaderValue) []byte {
	for _, h := range hs {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeString(1, h.Key)+sizeString(2, h.Value)))
		b = appendString(b, 1, h.Key)
		b = appendString(b, 2, h.Value)
	}
	return b
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	b = appendVarintField(b, 1, uint64(st.Code))
	if l := st.CurrentLimit; l != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeLimit(l)))
		b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
		b = appendVarintField(b, 2, uint64(l.Unit))
		b = appendString(b, 3, l.Name)
	}
	b = appendVarintField(b, 3, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeVarintField(1, uint64(d.Seconds))+sizeVarintField(2, uint64(int64(d.Nanos)))))
		b = appendVarintField(b, 1, uint64(d.Seconds))
		b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
	}
	return b
}

func sizeStatus(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarintField(1, uint64(st.Code)) + sizeVarintField(3, uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		n += sizeMessage(2, sizeLimit(l))
	}
	if d := st.DurationUntilReset; d != nil {
		n += sizeMessage(4, sizeVarintField(1, uint64(d.Seconds))+sizeVarintField(2, uint64(int64(d.Nanos))))
	}
	return n
}

func sizeLimit(l *rlsv3.RateLimitResponse_RateLimit) int {
	return sizeVarintField(1, uint64(l.RequestsPerUnit)) + sizeVarintField(2, uint64(l.Unit)) + sizeString(3, l.Name)
}

// The helpers below leave out a zero value, as proto3 does.

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func sizeVarintField(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func sizeMessage(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}
